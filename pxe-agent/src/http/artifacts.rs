//! Boot artifacts (kernels, initrds, EFI binaries) over HTTP: GET and HEAD
//! with single byte ranges, ETag and Last-Modified validators, from a root
//! directory that cannot be escaped.

use std::{
    io::SeekFrom,
    path::{Component, Path, PathBuf},
    time::SystemTime,
};

use axum::{
    body::Body,
    http::{HeaderMap, HeaderValue, Method, StatusCode, header},
    response::{IntoResponse, Response},
};
use tokio::io::{AsyncReadExt as _, AsyncSeekExt as _};
use tokio_util::io::ReaderStream;
use tracing::{info, warn};

use crate::clock;

/// Chunk size of the file bodies this path sends (the requests the
/// sendfile loop leaves to axum). Each connection holds up to about three
/// chunks at once (the file read, the stream's buffer, hyper's queue), so
/// the size bounds the memory a storm of such requests takes.
const CHUNK: usize = 64 * 1024;

/// The file under `root` that `rel` names, or `None` when `rel` would leave
/// the root (`..`, absolute paths, symlinks pointing outside, NUL bytes).
pub async fn resolve(root: &Path, rel: &str) -> Option<PathBuf> {
    if rel.contains('\0') {
        return None;
    }
    let rel = Path::new(rel);
    if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
        return None;
    }
    let root = tokio::fs::canonicalize(root).await.ok()?;
    let full = tokio::fs::canonicalize(root.join(rel)).await.ok()?;
    full.starts_with(&root).then_some(full)
}

/// A file response decided but not yet sent: status, headers, and the byte
/// range of the file that forms the body (none for HEAD).
pub struct Prepared {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub file: tokio::fs::File,
    pub start: u64,
    /// Body length; 0 for HEAD.
    pub len: u64,
}

/// Decides the response to `method` for `path` with the request's `headers`
/// (Range, If-None-Match). `Err` is a complete response without a body
/// worth sending from the file (404, 304, 416).
pub async fn prepare(
    path: &Path,
    method: &Method,
    headers: &HeaderMap,
) -> Result<Prepared, Response> {
    let not_found = || StatusCode::NOT_FOUND.into_response();
    // A source that went between the lookup and here is missing (404);
    // one that fails otherwise (permissions, I/O) is the server's fault.
    let failed = |e: std::io::Error| {
        if e.kind() == std::io::ErrorKind::NotFound {
            info!(path = %path.display(), "not served: no such file");
            not_found()
        } else {
            warn!(path = %path.display(), error = %e, "not served: failed to read the file");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    };
    let file = tokio::fs::File::open(path).await.map_err(failed)?;
    let meta = file.metadata().await.map_err(failed)?;
    if !meta.is_file() {
        warn!(path = %path.display(), "not served: not a regular file");
        return Err(not_found());
    }
    let size = meta.len();
    let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
    let etag = etag(size, modified);
    if headers
        .get(header::IF_NONE_MATCH)
        .is_some_and(|v| v.as_bytes() == etag.as_bytes())
    {
        return Err((StatusCode::NOT_MODIFIED, [(header::ETAG, etag)]).into_response());
    }
    let range = match headers
        .get(header::RANGE)
        .map(|v| parse_range(v.to_str().unwrap_or(""), size))
    {
        None => None,
        Some(Some(r)) => Some(r),
        Some(None) => {
            return Err((
                StatusCode::RANGE_NOT_SATISFIABLE,
                [(header::CONTENT_RANGE, format!("bytes */{size}"))],
            )
                .into_response());
        }
    };
    let (status, start, len) = match range {
        Some((start, end)) => (StatusCode::PARTIAL_CONTENT, start, end - start + 1),
        None => (StatusCode::OK, 0, size),
    };
    let mut out = HeaderMap::new();
    out.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(content_type(path)),
    );
    out.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    out.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    out.insert(header::ETAG, etag);
    if let Ok(v) = HeaderValue::from_str(&httpdate::fmt_http_date(modified)) {
        out.insert(header::LAST_MODIFIED, v);
    }
    let content_range = range.and_then(|_| {
        HeaderValue::from_str(&format!("bytes {start}-{}/{size}", start + len - 1)).ok()
    });
    if let Some(v) = content_range {
        out.insert(header::CONTENT_RANGE, v);
    }
    let len = if method == Method::HEAD { 0 } else { len };
    Ok(Prepared {
        status,
        headers: out,
        file,
        start,
        len,
    })
}

/// Serves `path` through axum: the body streamed in chunks. The boot
/// listener's own file path (`http::sendfile`) serves the same answers
/// with sendfile(2); this one is for requests it hands over.
pub async fn serve(path: &Path, method: &Method, headers: &HeaderMap) -> Response {
    let mut p = match prepare(path, method, headers).await {
        Ok(p) => p,
        Err(response) => return response,
    };
    let mut out = Response::builder().status(p.status);
    if let Some(h) = out.headers_mut() {
        h.extend(p.headers);
    }
    if p.len == 0 {
        return out
            .body(Body::empty())
            .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response());
    }
    if p.start > 0 && p.file.seek(SeekFrom::Start(p.start)).await.is_err() {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    let body = Body::from_stream(ReaderStream::with_capacity(p.file.take(p.len), CHUNK));
    out.body(body)
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// A strong validator from size and modification time.
fn etag(size: u64, modified: SystemTime) -> HeaderValue {
    let nanos = clock::since_epoch(modified).as_nanos();
    HeaderValue::from_str(&format!("\"{size:x}-{nanos:x}\""))
        .unwrap_or_else(|_| HeaderValue::from_static("\"0\""))
}

/// One `bytes=` range (RFC 9110 14.1.2) as inclusive offsets, or `None` when
/// it cannot be satisfied. Multiple ranges are answered with the first.
pub fn parse_range(spec: &str, size: u64) -> Option<(u64, u64)> {
    let first = spec.strip_prefix("bytes=")?.split(',').next()?.trim();
    let (a, b) = first.split_once('-')?;
    let (start, end) = match (a.trim(), b.trim()) {
        ("", suffix) => {
            let n: u64 = suffix.parse().ok()?;
            (size.checked_sub(n.min(size))?, size.checked_sub(1)?)
        }
        (a, "") => (a.parse().ok()?, size.checked_sub(1)?),
        (a, b) => (
            a.parse().ok()?,
            b.parse::<u64>().ok()?.min(size.checked_sub(1)?),
        ),
    };
    (start <= end && start < size).then_some((start, end))
}

/// What UEFI HTTP boot and iPXE expect for the common boot files.
fn content_type(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()) {
        Some("efi") => "application/efi",
        Some("ipxe") => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_follow_rfc_9110() {
        assert_eq!(parse_range("bytes=0-99", 1000), Some((0, 99)));
        assert_eq!(parse_range("bytes=900-", 1000), Some((900, 999)));
        assert_eq!(parse_range("bytes=-100", 1000), Some((900, 999)));
        assert_eq!(parse_range("bytes=990-2000", 1000), Some((990, 999)));
        assert_eq!(parse_range("bytes=1000-", 1000), None);
        assert_eq!(parse_range("bytes=5-2", 1000), None);
        assert_eq!(parse_range("items=0-1", 1000), None);
        assert_eq!(parse_range("bytes=0-0,5-6", 1000), Some((0, 0)));
    }

    #[tokio::test]
    async fn paths_cannot_leave_the_root() {
        let dir = std::env::temp_dir().join(format!("pxe-artifacts-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).expect("mkdir");
        std::fs::write(dir.join("sub/kernel"), b"k").expect("write");
        std::os::unix::fs::symlink("/etc/passwd", dir.join("escape")).expect("symlink");
        assert!(resolve(&dir, "sub/kernel").await.is_some());
        for bad in [
            "../etc/passwd",
            "/etc/passwd",
            "sub/../../etc/passwd",
            "escape",
            "sub/\0kernel",
            "missing",
        ] {
            assert_eq!(resolve(&dir, bad).await, None, "{bad:?}");
        }
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
