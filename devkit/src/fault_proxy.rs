//! A TCP proxy with faults, for putting a network between the service and what it talks to
//! (PostgreSQL, in the tests of `tests/it/db_faults.rs` and in the chaos run; the mock broker's
//! listeners): it listens on `127.0.0.1`, port 0, forwards every connection to one target — a
//! TCP address, or a Unix socket such as a PostgreSQL cluster's that listens on nothing else
//! — and on command
//!
//! - adds latency to each chunk it forwards, per direction;
//! - **freezes every open connection** — forwards nothing more either way (or one way) while
//!   keeping the sockets open, so the peers see no error at all, as with a hung server or a
//!   fail-over whose old address still acknowledges — while new connections go through;
//! - resets every open connection (both sockets closed with RST);
//! - freezes new connections from their start (a server that accepts and never answers);
//! - refuses new connections (each is reset as soon as it is accepted).
//!
//! A connection its client closed is reset toward the target at once (see
//! `Connection::client_left`): the target sees the client gone even while it reads nothing.
//!
//! A tap, given at start, sees every chunk forwarded upstream, once it was written to the target
//! (what [`crate::broker::EmbeddedBroker::start_proxied`] reads the Kafka requests from).
//!
//! It runs on a thread and runtime of its own, so it works the same under any test runtime and
//! stops, closing every socket, when dropped.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::sync::{Notify, oneshot};

/// Which way bytes flow through a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From the client (the service) to the target.
    Upstream,
    /// From the target back to the client.
    Downstream,
    Both,
}

impl Direction {
    fn includes(self, way: usize) -> bool {
        match self {
            Direction::Upstream => way == UP,
            Direction::Downstream => way == DOWN,
            Direction::Both => true,
        }
    }
}

const UP: usize = 0;
const DOWN: usize = 1;

/// A running proxy; see the module documentation.
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Sees each chunk the proxy forwarded upstream, with the number of its connection (counted
/// from 1 in the order accepted), once the target was sent it.
pub type UpstreamTap = Arc<dyn Fn(u64, &[u8]) + Send + Sync>;

/// Where the proxy forwards each connection.
#[derive(Debug, Clone)]
pub enum Target {
    Tcp(SocketAddr),
    /// A Unix socket's path (PostgreSQL's is `<dir>/.s.PGSQL.<port>`).
    Unix(PathBuf),
}

impl From<SocketAddr> for Target {
    fn from(addr: SocketAddr) -> Self {
        Target::Tcp(addr)
    }
}

/// What the controls change and the connections read.
struct Shared {
    target: Target,
    /// Added latency per direction, in microseconds.
    latency_us: [AtomicU64; 2],
    refuse: AtomicBool,
    freeze_new: AtomicBool,
    accepted: AtomicU64,
    connections: Mutex<Vec<Weak<Connection>>>,
    tap: Option<UpstreamTap>,
}

/// One proxied connection's fault state.
#[derive(Default)]
struct Connection {
    /// Its number, from 1 in the order accepted.
    number: u64,
    frozen: [AtomicBool; 2],
    reset: AtomicBool,
    /// Woken whenever `frozen` or `reset` changes.
    changed: Notify,
}

impl Connection {
    /// Returns once bytes may flow `way`; `false` if the connection is to be reset instead.
    async fn flowing(&self, way: usize) -> bool {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.reset.load(Ordering::Acquire) {
                return false;
            }
            if !self.frozen[way].load(Ordering::Acquire) {
                return true;
            }
            changed.await;
        }
    }

    /// The client closed its end: the connection is reset, so that the target sees it gone at
    /// once. A Kafka or PostgreSQL client never half-closes, and a FIN alone is not seen by a
    /// server that has stopped reading the connection — librdkafka's mock broker reads nothing
    /// from a member's connection while its JoinGroup waits for the group, and when that member
    /// joins again on a new connection it aborts (`rd_kafka_mock_cgrp_classic_member_add:
    /// Assertion '!member->resp'`). An RST is seen whatever the server polls for. What the
    /// client sent before closing went out ahead of the FIN (`shutdown`), before the reset.
    fn client_left(&self) {
        self.reset.store(true, Ordering::Release);
        self.changed.notify_waiters();
    }

    async fn reset_requested(&self) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.reset.load(Ordering::Acquire) {
                return;
            }
            changed.await;
        }
    }
}

impl FaultProxy {
    /// A proxy on `127.0.0.1`, port 0, forwarding to `target`.
    pub fn start(target: impl Into<Target>) -> std::io::Result<FaultProxy> {
        Self::start_with(target.into(), None)
    }

    /// A proxy as [`start`](Self::start) makes, whose upstream chunks `tap` sees.
    pub fn start_tapped(
        target: impl Into<Target>,
        tap: UpstreamTap,
    ) -> std::io::Result<FaultProxy> {
        Self::start_with(target.into(), Some(tap))
    }

    fn start_with(target: Target, tap: Option<UpstreamTap>) -> std::io::Result<FaultProxy> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            target,
            latency_us: [AtomicU64::new(0), AtomicU64::new(0)],
            refuse: AtomicBool::new(false),
            freeze_new: AtomicBool::new(false),
            accepted: AtomicU64::new(0),
            connections: Mutex::new(Vec::new()),
            tap,
        });
        let (stop, stopped) = oneshot::channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let accepting = shared.clone();
        let thread = std::thread::Builder::new()
            .name("fault-proxy".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = TcpListener::from_std(listener).expect("a tokio listener");
                    tokio::select! {
                        _ = accept(listener, accepting) => {}
                        _ = stopped => {}
                    }
                });
                // Dropping the runtime drops every connection's task, and so its sockets.
                drop(runtime);
            })?;
        Ok(FaultProxy {
            addr,
            shared,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Delays every chunk forwarded `direction` by `latency` (zero: none).
    pub fn set_latency(&self, direction: Direction, latency: Duration) {
        for way in [UP, DOWN] {
            if direction.includes(way) {
                self.shared.latency_us[way].store(latency.as_micros() as u64, Ordering::Release);
            }
        }
    }

    /// Freezes every connection open now, `direction`: nothing more is forwarded that way, and
    /// the sockets stay open. Connections made later are not affected. Returns how many
    /// connections were frozen.
    pub fn freeze_open(&self, direction: Direction) -> usize {
        self.each_open(|connection| {
            for way in [UP, DOWN] {
                if direction.includes(way) {
                    connection.frozen[way].store(true, Ordering::Release);
                }
            }
        })
    }

    /// Lets every frozen connection flow again (what was held is forwarded).
    pub fn thaw(&self) {
        self.each_open(|connection| {
            for way in [UP, DOWN] {
                connection.frozen[way].store(false, Ordering::Release);
            }
        });
    }

    /// Resets every open connection: both of its sockets are closed with RST. Returns how many.
    pub fn reset_all(&self) -> usize {
        self.each_open(|connection| connection.reset.store(true, Ordering::Release))
    }

    /// While `freeze` holds, every new connection is accepted and frozen both ways from the
    /// start (its target connected, nothing forwarded): a server that never answers. [`thaw`]
    /// lets those flow too.
    ///
    /// [`thaw`]: FaultProxy::thaw
    pub fn freeze_new(&self, freeze: bool) {
        self.shared.freeze_new.store(freeze, Ordering::Release);
    }

    /// While `refuse` holds, every new connection is reset as soon as it is accepted.
    pub fn refuse_new(&self, refuse: bool) {
        self.shared.refuse.store(refuse, Ordering::Release);
    }

    /// Connections open now (accepted, not yet closed).
    pub fn open_connections(&self) -> usize {
        self.each_open(|_| {})
    }

    /// Connections accepted since the start (refused ones included).
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::Acquire)
    }

    /// Applies `change` to each open connection and wakes it; returns how many there were.
    fn each_open(&self, change: impl Fn(&Connection)) -> usize {
        let mut connections = self.shared.connections.lock().unwrap();
        connections.retain(|connection| connection.strong_count() > 0);
        let mut count = 0;
        for connection in connections.iter().filter_map(Weak::upgrade) {
            change(&connection);
            connection.changed.notify_waiters();
            count += 1;
        }
        count
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn accept(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        let number = shared.accepted.fetch_add(1, Ordering::AcqRel) + 1;
        if shared.refuse.load(Ordering::Acquire) {
            reset_on_close(&client);
            continue;
        }
        let connection = Arc::new(Connection {
            number,
            ..Connection::default()
        });
        if shared.freeze_new.load(Ordering::Acquire) {
            for way in [UP, DOWN] {
                connection.frozen[way].store(true, Ordering::Release);
            }
        }
        shared
            .connections
            .lock()
            .unwrap()
            .push(Arc::downgrade(&connection));
        tokio::spawn(serve(client, connection, shared.clone()));
    }
}

/// Makes closing `stream` send RST instead of FIN. tokio deprecates `set_linger` because a
/// positive linger blocks the thread in `close`; a zero linger never blocks: it discards what is
/// unsent and resets the connection at once, which is the fault wanted here.
#[allow(deprecated)]
fn reset_on_close(stream: &TcpStream) {
    let _ = stream.set_linger(Some(Duration::ZERO));
}

/// Forwards one connection both ways until the target closed it, or until it is reset (as it is
/// when its client closes it).
async fn serve(mut client: TcpStream, connection: Arc<Connection>, shared: Arc<Shared>) {
    let _ = client.set_nodelay(true);
    match &shared.target {
        Target::Tcp(addr) => match TcpStream::connect(addr).await {
            Ok(mut target) => {
                let _ = target.set_nodelay(true);
                let (client_read, client_write) = client.split();
                let (target_read, target_write) = target.split();
                let ends = (client_read, client_write, target_read, target_write);
                if forward(ends, &connection, &shared).await {
                    reset_on_close(&target);
                    reset_on_close(&client);
                }
            }
            Err(_) => reset_on_close(&client),
        },
        // A Unix socket has no RST: its end of a reset connection is simply closed.
        Target::Unix(path) => match UnixStream::connect(path).await {
            Ok(mut target) => {
                let (client_read, client_write) = client.split();
                let (target_read, target_write) = target.split();
                let ends = (client_read, client_write, target_read, target_write);
                if forward(ends, &connection, &shared).await {
                    reset_on_close(&client);
                }
            }
            Err(_) => reset_on_close(&client),
        },
    }
}

/// Pumps both ways until both ends closed the connection (`false`) or it is to be reset
/// (`true`).
async fn forward(
    (client_read, client_write, target_read, target_write): (
        impl AsyncRead + Unpin,
        impl AsyncWrite + Unpin,
        impl AsyncRead + Unpin,
        impl AsyncWrite + Unpin,
    ),
    connection: &Connection,
    shared: &Shared,
) -> bool {
    let up = pump(client_read, target_write, UP, connection, shared);
    let down = pump(target_read, client_write, DOWN, connection, shared);
    tokio::select! {
        _ = futures::future::join(up, down) => connection.reset.load(Ordering::Acquire),
        _ = connection.reset_requested() => true,
    }
}

/// Copies `from` to `to`, honouring the freeze and the latency of `way`.
async fn pump(
    mut from: impl AsyncReadExt + Unpin,
    mut to: impl AsyncWriteExt + Unpin,
    way: usize,
    connection: &Connection,
    shared: &Shared,
) {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        if !connection.flowing(way).await {
            return;
        }
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                if way == UP {
                    connection.client_left();
                }
                return;
            }
            Ok(read) => read,
        };
        // A chunk read just before a freeze is held until the thaw.
        if !connection.flowing(way).await {
            return;
        }
        let latency = shared.latency_us[way].load(Ordering::Acquire);
        if latency > 0 {
            tokio::time::sleep(Duration::from_micros(latency)).await;
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
        if way == UP {
            if let Some(tap) = &shared.tap {
                tap(connection.number, &buffer[..read]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    /// An echo server on a port of its own, running until the runtime ends.
    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(echo(stream));
            }
        });
        addr
    }

    /// Sends back whatever `stream` receives, until it closes.
    async fn echo(stream: impl AsyncRead + AsyncWrite) {
        let (mut read, mut write) = tokio::io::split(stream);
        let _ = tokio::io::copy(&mut read, &mut write).await;
    }

    async fn round_trip(stream: &mut TcpStream, text: &[u8]) -> std::io::Result<Vec<u8>> {
        stream.write_all(text).await?;
        let mut answer = vec![0u8; text.len()];
        stream.read_exact(&mut answer).await?;
        Ok(answer)
    }

    /// How long a test waits for bytes that must not come: long enough for a local round trip
    /// to have happened many times over.
    const QUIET: Duration = Duration::from_millis(300);

    #[tokio::test]
    async fn a_unix_socket_target_is_forwarded_to_and_frozen_like_a_tcp_one() {
        let path = std::env::temp_dir().join(format!("fault-proxy-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(echo(stream));
            }
        });
        let proxy = FaultProxy::start(Target::Unix(path.clone())).unwrap();
        let mut old = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut old, b"before").await.unwrap(), b"before");
        assert_eq!(proxy.freeze_open(Direction::Both), 1);
        let held = tokio::time::timeout(QUIET, round_trip(&mut old, b"frozen")).await;
        assert!(held.is_err(), "a frozen connection answered: {held:?}");
        let mut new = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut new, b"new").await.unwrap(), b"new");
        proxy.thaw();
        let mut answer = vec![0u8; 6];
        old.read_exact(&mut answer).await.unwrap();
        assert_eq!(answer, b"frozen");
        let _ = std::fs::remove_file(&path);
    }

    #[tokio::test]
    async fn the_tap_sees_what_went_upstream_by_connection_and_only_once_it_was_sent() {
        type Seen = Vec<(u64, Vec<u8>)>;
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let tap: UpstreamTap = {
            let seen = seen.clone();
            Arc::new(move |connection, bytes| {
                seen.lock().unwrap().push((connection, bytes.to_vec()));
            })
        };
        let proxy = FaultProxy::start_tapped(echo_server().await, tap).unwrap();
        let mut first = TcpStream::connect(proxy.addr()).await.unwrap();
        let mut second = TcpStream::connect(proxy.addr()).await.unwrap();
        round_trip(&mut first, b"one").await.unwrap();
        round_trip(&mut second, b"two").await.unwrap();
        // Held by a freeze: not seen until it is forwarded.
        proxy.freeze_open(Direction::Upstream);
        first.write_all(b"held").await.unwrap();
        tokio::time::sleep(QUIET).await;
        assert_eq!(seen.lock().unwrap().len(), 2);
        proxy.thaw();
        let mut answer = [0u8; 4];
        first.read_exact(&mut answer).await.unwrap();
        let seen = seen.lock().unwrap().clone();
        assert_eq!(
            seen,
            vec![
                (1, b"one".to_vec()),
                (2, b"two".to_vec()),
                (1, b"held".to_vec())
            ]
        );
    }

    #[tokio::test]
    async fn a_frozen_connection_forwards_nothing_until_thawed_while_new_ones_flow() {
        let proxy = FaultProxy::start(echo_server().await).unwrap();
        let mut old = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut old, b"before").await.unwrap(), b"before");

        assert_eq!(proxy.freeze_open(Direction::Both), 1);
        let held = tokio::time::timeout(QUIET, round_trip(&mut old, b"frozen")).await;
        assert!(held.is_err(), "a frozen connection answered: {held:?}");

        let mut new = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut new, b"new").await.unwrap(), b"new");
        assert_eq!(proxy.open_connections(), 2);

        proxy.freeze_new(true);
        let mut born_frozen = TcpStream::connect(proxy.addr()).await.unwrap();
        let held = tokio::time::timeout(QUIET, round_trip(&mut born_frozen, b"late")).await;
        assert!(held.is_err(), "a connection made frozen answered: {held:?}");
        proxy.freeze_new(false);

        proxy.thaw();
        let mut answer = vec![0u8; 6];
        old.read_exact(&mut answer).await.unwrap();
        assert_eq!(
            answer, b"frozen",
            "what was held is forwarded after the thaw"
        );
        let mut answer = vec![0u8; 4];
        born_frozen.read_exact(&mut answer).await.unwrap();
        assert_eq!(answer, b"late");
    }

    #[tokio::test]
    async fn a_connection_frozen_one_way_still_carries_the_other() {
        let proxy = FaultProxy::start(echo_server().await).unwrap();
        let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut stream, b"x").await.unwrap(), b"x");
        proxy.freeze_open(Direction::Downstream);
        // Upstream bytes reach the echo server; its answer is held on the way back.
        let held = tokio::time::timeout(QUIET, round_trip(&mut stream, b"y")).await;
        assert!(held.is_err(), "{held:?}");
        proxy.thaw();
        let mut answer = [0u8; 1];
        stream.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"y");
    }

    #[tokio::test]
    async fn reset_closes_open_connections_and_refusal_closes_new_ones() {
        let proxy = FaultProxy::start(echo_server().await).unwrap();
        let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut stream, b"a").await.unwrap(), b"a");
        assert_eq!(proxy.reset_all(), 1);
        let mut byte = [0u8; 1];
        let after = stream.read(&mut byte).await;
        assert!(matches!(after, Ok(0) | Err(_)), "{after:?}");

        proxy.refuse_new(true);
        // The reset may reach the client before its connect returns, or after.
        let answer = match TcpStream::connect(proxy.addr()).await {
            Ok(mut refused) => round_trip(&mut refused, b"b").await,
            Err(err) => Err(err),
        };
        assert!(answer.is_err(), "a refused connection answered: {answer:?}");
        proxy.refuse_new(false);
        let mut accepted = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut accepted, b"c").await.unwrap(), b"c");
        assert_eq!(proxy.accepted(), 3);
    }

    #[tokio::test]
    async fn latency_delays_each_direction() {
        let proxy = FaultProxy::start(echo_server().await).unwrap();
        let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
        proxy.set_latency(Direction::Upstream, Duration::from_millis(150));
        proxy.set_latency(Direction::Downstream, Duration::from_millis(100));
        let started = Instant::now();
        assert_eq!(round_trip(&mut stream, b"slow").await.unwrap(), b"slow");
        assert!(
            started.elapsed() >= Duration::from_millis(250),
            "{:?}",
            started.elapsed()
        );
        proxy.set_latency(Direction::Both, Duration::ZERO);
        let started = Instant::now();
        round_trip(&mut stream, b"fast").await.unwrap();
        assert!(
            started.elapsed() < Duration::from_millis(100),
            "{:?}",
            started.elapsed()
        );
    }
}
