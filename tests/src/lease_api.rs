//! A minimal fake of the Kubernetes API server for the pool-sharing test:
//! coordination.k8s.io/v1 Leases only, in any namespace, over plain HTTP/1.1
//! with keep-alive. It implements list, get, create (409 AlreadyExists) and
//! replace (404 NotFound, 409 Conflict on a stale resourceVersion) with one
//! global resourceVersion counter, as the real server's optimistic
//! concurrency does; nothing else (no watch, patch, delete, selectors,
//! authentication or TLS). The pool-sharing test runs it on a thread in
//! its bridge namespace; `fake-lease-api ADDR` runs it on its own.

use std::{
    collections::BTreeMap,
    io::{self, BufRead as _, BufReader, Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::{self, JoinHandle},
    time::Duration,
};

use serde_json::{Value, json};

#[derive(Default)]
struct Store {
    version: u64,
    /// (namespace, name) → the Lease as last written.
    leases: BTreeMap<(String, String), Value>,
}

/// A running fake; stops (and closes its listener) on drop.
pub struct LeaseApi {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl LeaseApi {
    /// Serves on `listener` until dropped.
    pub fn serve(listener: TcpListener) -> io::Result<LeaseApi> {
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let store = Arc::new(Mutex::new(Store::default()));
        let flag = stop.clone();
        let accept = thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let (store, flag) = (store.clone(), flag.clone());
                        thread::spawn(move || serve(conn, &store, &flag));
                    }
                    Err(_) => thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Ok(LeaseApi {
            addr,
            stop,
            accept: Some(accept),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for LeaseApi {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

fn serve(conn: TcpStream, store: &Mutex<Store>, stop: &AtomicBool) {
    let _ = conn.set_nonblocking(false);
    // Wakes up now and then to see whether the fake is stopping.
    let _ = conn.set_read_timeout(Some(Duration::from_millis(200)));
    let Ok(read) = conn.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read);
    let mut out = conn;
    loop {
        let mut line = String::new();
        loop {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            match reader.read_line(&mut line) {
                Ok(0) => return,
                Ok(_) => break,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => return,
            }
        }
        let mut parts = line.split_whitespace();
        let (method, target) = (
            parts.next().unwrap_or("").to_string(),
            parts.next().unwrap_or("").to_string(),
        );
        let mut length = 0usize;
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let path = target.split('?').next().unwrap_or("").to_string();
        let (code, reply) = handle(&method, &path, &body, store);
        let bytes = reply.to_string();
        let head = format!(
            "HTTP/1.1 {code} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            if code < 300 { "OK" } else { "Error" },
            bytes.len()
        );
        if out.write_all(head.as_bytes()).is_err() || out.write_all(bytes.as_bytes()).is_err() {
            return;
        }
    }
}

fn status(code: u16, reason: &str, message: String) -> (u16, Value) {
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": message, "reason": reason, "code": code}),
    )
}

fn handle(method: &str, path: &str, body: &[u8], store: &Mutex<Store>) -> (u16, Value) {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    // apis/coordination.k8s.io/v1/namespaces/{ns}/leases[/{name}]
    let (ns, name) = match segs.as_slice() {
        [
            "apis",
            "coordination.k8s.io",
            "v1",
            "namespaces",
            ns,
            "leases",
        ] => (*ns, None),
        [
            "apis",
            "coordination.k8s.io",
            "v1",
            "namespaces",
            ns,
            "leases",
            name,
        ] => (*ns, Some(*name)),
        _ => {
            return status(
                404,
                "NotFound",
                format!("{path} is not served by this fake"),
            );
        }
    };
    let mut s = store.lock().unwrap_or_else(|e| e.into_inner());
    let key = |n: &str| (ns.to_string(), n.to_string());
    match (method, name) {
        ("GET", None) => {
            let items: Vec<Value> = s
                .leases
                .iter()
                .filter(|((n, _), _)| n == ns)
                .map(|(_, v)| v.clone())
                .collect();
            (
                200,
                json!({"apiVersion": "coordination.k8s.io/v1", "kind": "LeaseList",
                       "metadata": {"resourceVersion": s.version.to_string()}, "items": items}),
            )
        }
        ("GET", Some(n)) => match s.leases.get(&key(n)) {
            Some(v) => (200, v.clone()),
            None => status(404, "NotFound", format!("leases \"{n}\" not found")),
        },
        ("POST", None) => {
            let Ok(mut lease) = serde_json::from_slice::<Value>(body) else {
                return status(400, "BadRequest", "body is not JSON".into());
            };
            let Some(n) = lease["metadata"]["name"].as_str().map(str::to_string) else {
                return status(422, "Invalid", "metadata.name is required".into());
            };
            if s.leases.contains_key(&key(&n)) {
                return status(
                    409,
                    "AlreadyExists",
                    format!("leases \"{n}\" already exists"),
                );
            }
            s.version += 1;
            lease["apiVersion"] = json!("coordination.k8s.io/v1");
            lease["kind"] = json!("Lease");
            lease["metadata"]["namespace"] = json!(ns);
            lease["metadata"]["resourceVersion"] = json!(s.version.to_string());
            lease["metadata"]["uid"] = json!(format!("fake-{}", s.version));
            s.leases.insert(key(&n), lease.clone());
            (201, lease)
        }
        ("PUT", Some(n)) => {
            let Ok(mut lease) = serde_json::from_slice::<Value>(body) else {
                return status(400, "BadRequest", "body is not JSON".into());
            };
            let Some(current) = s.leases.get(&key(n)) else {
                return status(404, "NotFound", format!("leases \"{n}\" not found"));
            };
            let have = current["metadata"]["resourceVersion"].clone();
            let uid = current["metadata"]["uid"].clone();
            let sent = &lease["metadata"]["resourceVersion"];
            if !sent.is_null() && *sent != have {
                return status(
                    409,
                    "Conflict",
                    format!(
                        "Operation cannot be fulfilled on leases.coordination.k8s.io \"{n}\": \
                         the object has been modified; please apply your changes to the \
                         latest version and try again"
                    ),
                );
            }
            s.version += 1;
            lease["apiVersion"] = json!("coordination.k8s.io/v1");
            lease["kind"] = json!("Lease");
            lease["metadata"]["namespace"] = json!(ns);
            lease["metadata"]["uid"] = uid;
            lease["metadata"]["resourceVersion"] = json!(s.version.to_string());
            s.leases.insert(key(n), lease.clone());
            (200, lease)
        }
        _ => status(405, "MethodNotAllowed", format!("{method} {path}")),
    }
}
