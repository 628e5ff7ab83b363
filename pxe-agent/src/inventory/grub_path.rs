//! Which URLs grub can read, and by what name: `tftp://` and `http://`
//! URLs map to grub's `(tftp,host)/path` and `(http,host:port)/path`
//! devices. Owns that mapping, which validation checks a grub profile's
//! kernel and initrd against and `http::grub` renders with.

/// grub's name for a file at `url`: `tftp://host/path` becomes
/// `(tftp,host)/path`, `http://host[:port]/path` becomes
/// `(http,host[:port])/path`. `None` for any other URL or one without a
/// host or path. grub's http module speaks plain HTTP only.
pub fn grub_path(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let scheme = match scheme.to_ascii_lowercase().as_str() {
        "tftp" => "tftp",
        "http" => "http",
        _ => return None,
    };
    let (authority, path) = rest.split_once('/')?;
    if authority.is_empty() || authority.contains('@') || path.is_empty() {
        return None;
    }
    Some(format!("({scheme},{authority})/{path}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_become_grub_devices() {
        assert_eq!(
            grub_path("tftp://10.66.0.1/boot/vmlinuz").as_deref(),
            Some("(tftp,10.66.0.1)/boot/vmlinuz")
        );
        assert_eq!(
            grub_path("http://10.66.0.1:8080/artifacts/initrd.img").as_deref(),
            Some("(http,10.66.0.1:8080)/artifacts/initrd.img")
        );
        assert_eq!(
            grub_path("HTTP://{server}/k").as_deref(),
            Some("(http,{server})/k")
        );
        for bad in [
            "https://10.66.0.1/vmlinuz",
            "ftp://x/y",
            "vmlinuz",
            "/vmlinuz",
            "http:///vmlinuz",
            "http://host",
            "http://host/",
            "http://user@host/k",
        ] {
            assert_eq!(grub_path(bad), None, "{bad}");
        }
    }
}
