//! The socket before any request: which connections the edge accepts, and how long it waits for
//! them. Nothing here knows about credentials — a client that never finishes its headers never
//! reaches authentication, so the failed-authentication budget cannot stop it; these limits do:
//! - a request's head must arrive within `header_read_timeout` of the connection opening or of
//!   the previous response (HTTP/1.1; hyper's timer), and a connection with no traffic at all
//!   for `idle_timeout` is closed (any protocol);
//! - at most `max_connections` connections at once, and `max_connections_per_peer` from one
//!   address; past either the edge answers 503 and closes at once (load shedding), well before
//!   the process runs out of file descriptors, so `/healthz` and authenticated calls go on;
//! - at start the soft limit of open files is raised to the hard limit where allowed, and the
//!   connection cap is kept below it.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tower::Service;

/// File descriptors kept back from the connection cap: the database pool, the readiness
/// connection, the listener, logs and the runtime.
const RESERVED_DESCRIPTORS: u64 = 64;

#[derive(Debug, Clone)]
pub struct ListenerConfig {
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    /// 0: derived from the open-files limit.
    pub max_connections: usize,
    /// 0: no per-address cap (behind a reverse proxy every client has the proxy's address).
    pub max_connections_per_peer: usize,
    /// Descriptors the process needs besides client connections (the pool, mostly).
    pub reserved_descriptors: u64,
}

/// Raises the soft limit of open files to the hard limit (where allowed) and returns
/// (soft, hard) as they are afterwards.
pub fn raise_open_files_limit() -> (u64, u64) {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a valid out-parameter of the right type.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return (0, 0);
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
    }
    (limit.rlim_cur as u64, limit.rlim_max as u64)
}

/// The connection cap: the configured one, or what the open-files limit leaves, whichever is
/// lower (a configured cap above it would end in "Too many open files").
pub fn connection_cap(configured: usize, soft_limit: u64, reserved: u64) -> usize {
    let room = soft_limit.saturating_sub(reserved + RESERVED_DESCRIPTORS).max(1);
    let room = usize::try_from(room).unwrap_or(usize::MAX);
    if configured == 0 {
        room.min(100_000)
    } else {
        configured.min(room)
    }
}

/// Counts connections, in total and per peer address.
pub struct Admission {
    max_total: usize,
    max_per_peer: usize,
    total: AtomicUsize,
    per_peer: Mutex<HashMap<IpAddr, usize>>,
    shed: AtomicU64,
}

/// One admitted connection; leaving frees its place.
pub struct Admitted {
    admission: Arc<Admission>,
    peer: IpAddr,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.admission.total.fetch_sub(1, Ordering::AcqRel);
        if self.admission.max_per_peer > 0 {
            let mut peers = self.admission.per_peer.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(n) = peers.get_mut(&self.peer) {
                *n -= 1;
                if *n == 0 {
                    peers.remove(&self.peer);
                }
            }
        }
    }
}

impl Admission {
    pub fn new(max_total: usize, max_per_peer: usize) -> Arc<Self> {
        Arc::new(Admission {
            max_total: max_total.max(1),
            max_per_peer,
            total: AtomicUsize::new(0),
            per_peer: Mutex::new(HashMap::new()),
            shed: AtomicU64::new(0),
        })
    }

    /// A place for a connection from `peer`, or None when the edge is full or that peer holds
    /// its share.
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<Admitted> {
        if self.total.fetch_add(1, Ordering::AcqRel) >= self.max_total {
            self.total.fetch_sub(1, Ordering::AcqRel);
            self.shed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        if self.max_per_peer > 0 {
            let mut peers = self.per_peer.lock().unwrap_or_else(|e| e.into_inner());
            let n = peers.entry(peer).or_insert(0);
            if *n >= self.max_per_peer {
                drop(peers);
                self.total.fetch_sub(1, Ordering::AcqRel);
                self.shed.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            *n += 1;
        }
        Some(Admitted { admission: self.clone(), peer })
    }

    pub fn open(&self) -> usize {
        self.total.load(Ordering::Acquire)
    }

    /// Connections shed since the last call.
    fn take_shed(&self) -> u64 {
        self.shed.swap(0, Ordering::Relaxed)
    }
}

/// What a shed connection reads before it is closed (nothing of the request was read).
fn shed_response() -> &'static [u8] {
    static RESPONSE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    RESPONSE.get_or_init(|| {
        let code = crate::error::Code::Overloaded;
        let body = format!(
            r#"{{"error":{{"code":"{code}","message":"too many connections; retry shortly","retry_after":1}}}}"#
        );
        format!(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n\
             connection: close\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    })
}

/// Serves `app` on `listener` until `stop` turns true, then lets open connections finish their
/// requests (the caller bounds how long).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    config: ListenerConfig,
    mut stop: watch::Receiver<bool>,
) -> io::Result<()> {
    let (soft, hard) = raise_open_files_limit();
    let cap = connection_cap(config.max_connections, soft, config.reserved_descriptors);
    if config.max_connections > cap {
        tracing::warn!(
            configured = config.max_connections,
            cap,
            open_files_limit = soft,
            "--max-connections exceeds what the open-files limit allows; capped"
        );
    }
    tracing::info!(
        open_files_limit = soft,
        open_files_hard_limit = hard,
        max_connections = cap,
        max_connections_per_peer = config.max_connections_per_peer,
        header_read_timeout_secs = config.header_read_timeout.as_secs_f64(),
        idle_timeout_secs = config.idle_timeout.as_secs_f64(),
        "connection limits"
    );
    let admission = Admission::new(cap, config.max_connections_per_peer);
    let mut make_service = app.into_make_service_with_connect_info::<SocketAddr>();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(config.header_read_timeout).keep_alive(true);
    builder.http2().timer(TokioTimer::new()).keep_alive_interval(None);
    let builder = Arc::new(builder);
    let (drained_tx, mut drained_rx) = watch::channel(());
    let mut last_report = Instant::now();
    let mut accept_errors: u64 = 0;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|stop| *stop) => break,
        };
        if last_report.elapsed() >= Duration::from_secs(5) {
            let shed = admission.take_shed();
            if shed > 0 || accept_errors > 0 {
                tracing::warn!(
                    shed,
                    accept_errors,
                    open = admission.open(),
                    "connections refused in the last seconds"
                );
            }
            accept_errors = 0;
            last_report = Instant::now();
        }
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors or similar: back off briefly instead of spinning.
                accept_errors += 1;
                if accept_errors == 1 {
                    tracing::error!(error = %e, "accept failed");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(admitted) = admission.admit(peer.ip()) else {
            let _ = stream.try_write(shed_response());
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let service = match make_service.call(peer).await {
            Ok(service) => service,
            Err(never) => match never {},
        };
        let builder = builder.clone();
        let mut stop = stop.clone();
        let drained = drained_tx.clone();
        let idle_timeout = config.idle_timeout;
        tokio::spawn(async move {
            let _admitted = admitted;
            let _drained = drained;
            let watched = Watched::new(stream);
            let activity = watched.activity.clone();
            let connection = builder
                .serve_connection_with_upgrades(TokioIo::new(watched), TowerToHyperService::new(service));
            tokio::pin!(connection);
            let mut stopping = false;
            loop {
                let idle_for = activity.idle_for();
                let wait = idle_timeout.saturating_sub(idle_for);
                tokio::select! {
                    _ = connection.as_mut() => break,
                    _ = stop.wait_for(|stop| *stop), if !stopping => {
                        stopping = true;
                        connection.as_mut().graceful_shutdown();
                    }
                    _ = tokio::time::sleep(wait) => {
                        if activity.idle_for() >= idle_timeout {
                            break;
                        }
                    }
                }
            }
        });
    }
    drop(listener);
    drop(drained_tx);
    // Every connection task holds a sender: when all are gone, every connection has ended.
    let _ = drained_rx.wait_for(|_| false).await;
    Ok(())
}

/// When the connection last carried a byte, as milliseconds since it opened.
struct Activity {
    opened: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn touch(&self) {
        self.last_ms.store(self.opened.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    fn idle_for(&self) -> Duration {
        let now = self.opened.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.last_ms.load(Ordering::Relaxed)))
    }
}

/// A socket that notes when it last read or wrote anything.
struct Watched {
    stream: TcpStream,
    activity: Arc<Activity>,
}

impl Watched {
    fn new(stream: TcpStream) -> Self {
        Watched {
            stream,
            activity: Arc::new(Activity { opened: Instant::now(), last_ms: AtomicU64::new(0) }),
        }
    }
}

impl AsyncRead for Watched {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.activity.touch();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.touch();
        }
        polled
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_stays_below_the_open_files_limit() {
        assert_eq!(connection_cap(0, 1024, 20), 1024 - 20 - RESERVED_DESCRIPTORS as usize);
        assert_eq!(connection_cap(500, 1024, 20), 500);
        assert_eq!(connection_cap(5000, 1024, 20), 1024 - 20 - RESERVED_DESCRIPTORS as usize);
        assert_eq!(connection_cap(0, 10, 20), 1);
    }

    #[test]
    fn admission_counts_per_peer_and_in_total_and_frees_on_drop() {
        let admission = Admission::new(3, 2);
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let first = admission.admit(a).expect("first");
        let second = admission.admit(a).expect("second");
        assert!(admission.admit(a).is_none(), "a third from one peer is shed");
        let third = admission.admit(b).expect("another peer");
        assert!(admission.admit(b).is_none(), "the edge is full");
        assert_eq!(admission.open(), 3);
        drop(first);
        assert!(admission.admit(a).is_some(), "a place came free");
        drop((second, third));
        assert_eq!(admission.take_shed(), 2);
    }

    #[test]
    fn the_shed_response_is_a_complete_http_response() {
        let text = std::str::from_utf8(shed_response()).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .and_then(|v| v.parse().ok())
            .unwrap();
        assert_eq!(body.len(), length);
        assert!(serde_json::from_str::<serde_json::Value>(body.trim()).is_ok());
    }
}
