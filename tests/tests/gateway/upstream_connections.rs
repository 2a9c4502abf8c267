//! The upstream connections a client connection drives itself (`gateway/src/proxy/upstream.rs`):
//! kept alive and reused, one per client connection, never reused after an upstream closed
//! them, and never a request sent twice. And the proxy threads' CPU pinning.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use fencing_tests::gateway::Gateway;
use fencing_tests::pg::TestDb;
use http::{Method, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What a counting upstream saw.
#[derive(Default)]
struct Seen {
    connections: AtomicUsize,
    requests: AtomicUsize,
}

/// How the counting upstream answers.
#[derive(Clone, Copy)]
enum Answer {
    /// 200 with a two-byte body, keep-alive.
    Body,
    /// 204, no body, keep-alive.
    Empty,
    /// 200 with a body, then the connection closed without a word (as an idle timeout would).
    ThenClose,
}

/// An upstream that counts the connections it accepts and the request heads it reads (each
/// request of these tests has a body of at most a few bytes, sent with its head).
async fn counting_upstream(answer: Answer) -> (SocketAddr, Arc<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let counters = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            counters.connections.fetch_add(1, Ordering::SeqCst);
            let counters = Arc::clone(&counters);
            tokio::spawn(async move {
                let mut pending = Vec::new();
                let mut buffer = [0_u8; 4096];
                loop {
                    let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match stream.read(&mut buffer).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => pending.extend_from_slice(&buffer[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&pending[..end]).to_ascii_lowercase();
                    let length = head
                        .lines()
                        .find_map(|line| line.strip_prefix("content-length:"))
                        .and_then(|value| value.trim().parse::<usize>().ok())
                        .unwrap_or(0);
                    while pending.len() < end + 4 + length {
                        match stream.read(&mut buffer).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => pending.extend_from_slice(&buffer[..n]),
                        }
                    }
                    pending.drain(..end + 4 + length);
                    counters.requests.fetch_add(1, Ordering::SeqCst);
                    let reply: &[u8] = match answer {
                        Answer::Body | Answer::ThenClose => b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
                        Answer::Empty => b"HTTP/1.1 204 No Content\r\n\r\n",
                    };
                    if stream.write_all(reply).await.is_err() {
                        return;
                    }
                    if let Answer::ThenClose = answer {
                        return;
                    }
                }
            });
        }
    });
    (addr, seen)
}

fn config(upstream: SocketAddr, proxy: &str) -> String {
    format!(
        "[proxy]\n{proxy}\n[[routes]]\nprefix = \"/free\"\nupstream = \"http://{upstream}\"\nresource = {{ segment = 2 }}\n"
    )
}

/// One keep-alive client connection, spoken by hand (a pooled client may open a second one
/// when a request follows its predecessor's answer too closely).
struct KeepAlive {
    proxy: SocketAddr,
    stream: Option<TcpStream>,
    pending: Vec<u8>,
}

impl KeepAlive {
    fn new(proxy: SocketAddr) -> KeepAlive {
        KeepAlive { proxy, stream: None, pending: Vec::new() }
    }

    /// Sends one request on the connection (opening it the first time, and again after the
    /// gateway closed it); returns the status.
    async fn send(&mut self, method: &Method, path: &str) -> StatusCode {
        if self.stream.is_none() {
            self.stream = Some(TcpStream::connect(self.proxy).await.unwrap());
            self.pending.clear();
        }
        let stream = self.stream.as_mut().unwrap();
        // A write carries a body; a read carries none (the gateway refuses a body on an unfenced method).
        let body = if *method == Method::GET { "" } else { "{}" };
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nFencing-Token: 1\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let (status, length, end) = loop {
            if let Some(end) = self.pending.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&self.pending[..end]).to_ascii_lowercase();
                let status = head.split(' ').nth(1).and_then(|code| code.parse::<u16>().ok()).unwrap();
                let length = head
                    .lines()
                    .find_map(|line| line.strip_prefix("content-length:"))
                    .map_or(0, |value| value.trim().parse::<usize>().unwrap());
                break (status, length, end + 4);
            }
            let mut buffer = [0_u8; 4096];
            let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buffer)).await.unwrap().unwrap();
            assert!(n > 0, "the gateway closed the connection before answering");
            self.pending.extend_from_slice(&buffer[..n]);
        };
        while self.pending.len() < end + length {
            let mut buffer = [0_u8; 4096];
            let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buffer)).await.unwrap().unwrap();
            assert!(n > 0, "the gateway closed the connection in the middle of an answer");
            self.pending.extend_from_slice(&buffer[..n]);
        }
        self.pending.drain(..end + length);
        StatusCode::from_u16(status).unwrap()
    }
}

/// Sends `count` requests one after another on `client`; returns their statuses.
async fn send_in_turn(client: &mut KeepAlive, method: Method, count: usize) -> Vec<StatusCode> {
    let mut statuses = Vec::new();
    for n in 0..count {
        statuses.push(client.send(&method, &format!("/free/acct-{n}/x")).await);
    }
    statuses
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_connection_reuses_one_upstream_connection_for_bodies_and_empty_answers() {
    let db = TestDb::new().await;
    for (answer, expected) in [(Answer::Body, StatusCode::OK), (Answer::Empty, StatusCode::NO_CONTENT)] {
        let (upstream, seen) = counting_upstream(answer).await;
        // Both ways a proxy listener runs: on threads of its own, and on the shared runtime.
        for proxy in ["threads = 2", "threads = 0"] {
            let gateway = Gateway::start(&db.url(), &config(upstream, proxy)).await.unwrap();
            let before = seen.connections.load(Ordering::SeqCst);
            let mut client = KeepAlive::new(gateway.proxy);
            let statuses = send_in_turn(&mut client, Method::POST, 10).await;
            let statuses_get = send_in_turn(&mut client, Method::GET, 10).await;
            assert!(statuses.iter().chain(&statuses_get).all(|s| *s == expected), "{statuses:?} {statuses_get:?}");
            assert_eq!(
                seen.connections.load(Ordering::SeqCst) - before,
                1,
                "20 requests on one client connection ({proxy}) took one upstream connection"
            );
            // Three client connections at once: one upstream connection each.
            let mut clients: Vec<KeepAlive> = (0..3).map(|_| KeepAlive::new(gateway.proxy)).collect();
            let rounds = clients.iter_mut().map(|client| send_in_turn(client, Method::POST, 5));
            for statuses in futures::future::join_all(rounds).await {
                assert!(statuses.iter().all(|s| *s == expected), "{statuses:?}");
            }
            assert_eq!(
                seen.connections.load(Ordering::SeqCst) - before,
                4,
                "one upstream connection per client connection"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_closes_idle_connections_gets_every_request_once_on_a_new_connection() {
    let db = TestDb::new().await;
    let (upstream, seen) = counting_upstream(Answer::ThenClose).await;
    let gateway = Gateway::start(&db.url(), &config(upstream, "threads = 2")).await.unwrap();
    let mut client = KeepAlive::new(gateway.proxy);
    let mut statuses = Vec::new();
    for _ in 0..15 {
        // The upstream's close arrives before the next request (a request sent on a connection
        // the upstream closes at that very moment fails: HTTP/1.1 cannot tell whether it was
        // read, so a write is never sent again).
        tokio::time::sleep(Duration::from_millis(20)).await;
        statuses.extend(send_in_turn(&mut client, Method::POST, 1).await);
        tokio::time::sleep(Duration::from_millis(20)).await;
        statuses.extend(send_in_turn(&mut client, Method::GET, 1).await);
    }
    assert!(statuses.iter().all(|s| *s == StatusCode::OK), "{statuses:?}");
    // Fenced writes and reads alike: each reached the upstream exactly once, on a connection
    // of its own (the closed ones were never sent on again).
    assert_eq!(seen.requests.load(Ordering::SeqCst), 30);
    assert_eq!(seen.connections.load(Ordering::SeqCst), 30);
}

/// The CPUs a thread may run on, from `/proc/PID/task/TID/status`.
fn allowed(status: &str) -> String {
    status.lines().find_map(|line| line.strip_prefix("Cpus_allowed_list:")).unwrap_or("").trim().to_owned()
}

/// The proxy threads of `gateway` and the CPUs each may run on, by thread name.
fn proxy_threads(gateway: &Gateway) -> Vec<(String, String)> {
    let pid = gateway.pid().unwrap().as_raw();
    let mut threads = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let name = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default().trim().to_owned();
        if name.starts_with("proxy-") {
            threads.push((name, allowed(&std::fs::read_to_string(task.path().join("status")).unwrap_or_default())));
        }
    }
    threads.sort();
    threads
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_threads_are_pinned_one_per_cpu_unless_told_not_to() {
    let db = TestDb::new().await;
    let (upstream, _) = counting_upstream(Answer::Body).await;
    let process = allowed(&std::fs::read_to_string("/proc/self/status").unwrap());

    let pinned = Gateway::start(&db.url(), &config(upstream, "threads = 2\npin_threads = true")).await.unwrap();
    let threads = proxy_threads(&pinned);
    assert_eq!(threads.len(), 2, "{threads:?}");
    for (name, cpus) in &threads {
        assert!(cpus.parse::<usize>().is_ok(), "{name} may run on {cpus:?}, not on one CPU");
    }
    if std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2 {
        assert_ne!(threads[0].1, threads[1].1, "two proxy threads on one CPU: {threads:?}");
    }
    // Pinned, the proxy still answers from both threads.
    let statuses = send_in_turn(&mut KeepAlive::new(pinned.proxy), Method::POST, 3).await;
    assert!(statuses.iter().all(|s| *s == StatusCode::OK), "{statuses:?}");

    let free = Gateway::start(&db.url(), &config(upstream, "threads = 2\npin_threads = false")).await.unwrap();
    for (name, cpus) in proxy_threads(&free) {
        assert_eq!(cpus, process, "{name} was pinned though told not to be");
    }
}

/// What the early-answering upstream saw of the write.
struct EarlySeen {
    /// When the request's head was in.
    head_at: tokio::time::Instant,
    /// Body bytes read, in all.
    body: usize,
    /// Body bytes read after the write's deadline (head + forward timeout + 50 ms).
    after_deadline: usize,
}

/// An upstream that answers a write as soon as its head is in, before reading its body (as an
/// upstream that answers 413 or streams a reply early may), streams that answer for 3 s, and
/// reads nothing of the body for 2 s: its receive buffer is small, so the gateway's connection
/// is still sending the body while the answer streams back. Then it reads what comes.
async fn early_answering_upstream(
    forward_timeout: Duration,
    complete: bool,
) -> (SocketAddr, tokio::sync::oneshot::Receiver<EarlySeen>) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(16).unwrap();
    let addr = listener.local_addr().unwrap();
    let (report, seen) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let (mut reader, mut writer) = stream.into_split();
        // The head only (its end may share a read with the body's first bytes).
        let mut pending = Vec::new();
        let mut byte = [0_u8; 1];
        while !pending.ends_with(b"\r\n\r\n") {
            if reader.read(&mut byte).await.unwrap_or(0) == 0 {
                return;
            }
            pending.push(byte[0]);
        }
        let head_at = tokio::time::Instant::now();
        let deadline = head_at + forward_timeout + Duration::from_millis(50);
        tokio::spawn(async move {
            if complete {
                // A whole answer at once (an early 413), the connection kept alive.
                let _ = writer.write_all(b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 0\r\n\r\n").await;
                tokio::time::sleep(Duration::from_secs(6)).await;
                return;
            }
            let _ = writer.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n").await;
            for _ in 0..30 {
                if writer.write_all(b"1\r\n.\r\n").await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let _ = writer.write_all(b"0\r\n\r\n").await;
        });
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (mut body, mut after_deadline) = (0, 0);
        let mut buffer = vec![0_u8; 65536];
        loop {
            match tokio::time::timeout(Duration::from_secs(3), reader.read(&mut buffer)).await {
                Ok(Ok(n)) if n > 0 => {
                    body += n;
                    if tokio::time::Instant::now() > deadline {
                        after_deadline += n;
                    }
                }
                _ => break,
            }
        }
        let _ = report.send(EarlySeen { head_at, body, after_deadline });
    });
    (addr, seen)
}

/// A gateway (forward timeout `forward_timeout`) in front of [`early_answering_upstream`], and a
/// 1 MB fenced write sent through it: the gateway, the client's connection, what the upstream
/// will report, and the write's body length.
async fn write_to_an_early_answerer(
    db: &TestDb,
    forward_timeout: Duration,
    complete: bool,
) -> (Gateway, TcpStream, tokio::sync::oneshot::Receiver<EarlySeen>, usize) {
    let (upstream, seen) = early_answering_upstream(forward_timeout, complete).await;
    let gateway = Gateway::start(
        &db.url(),
        &format!(
            "[proxy]\nthreads = 2\n[upstream]\nforward_timeout_ms = {}\n[[routes]]\nprefix = \"/free\"\n\
             upstream = \"http://{upstream}\"\nresource = {{ segment = 2 }}\n",
            forward_timeout.as_millis()
        ),
    )
    .await
    .unwrap();
    let body = vec![b'x'; 1_000_000];
    let mut client = TcpStream::connect(gateway.proxy).await.unwrap();
    let head = format!(
        "POST /free/acct-1/x HTTP/1.1\r\nHost: localhost\r\nFencing-Token: 1\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    client.write_all(head.as_bytes()).await.unwrap();
    client.write_all(&body).await.unwrap();
    (gateway, client, seen, body.len())
}

/// S5 after an early answer: the upstream answers a 1 MB write before reading its body and
/// streams that answer past the write's deadline. The gateway's connection would go on sending
/// the body while it relays the answer; at the deadline it cuts the answer and resets the
/// connection instead, so the upstream gets no byte of the write after the deadline beyond what
/// its own small receive buffer already held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s5_no_byte_of_a_write_after_its_deadline_when_the_upstream_answers_early() {
    let db = TestDb::new().await;
    let forward_timeout = Duration::from_millis(1000);
    let (_gateway, mut client, seen, body) = write_to_an_early_answerer(&db, forward_timeout, false).await;
    // The answer: its head, then the streamed body until the gateway ends it.
    let mut answer = Vec::new();
    let mut buffer = [0_u8; 4096];
    while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(6), client.read(&mut buffer)).await {
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&buffer[..n]);
    }
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "the early answer was not relayed: {answer:?}");
    let seen = tokio::time::timeout(Duration::from_secs(15), seen).await.unwrap().unwrap();
    println!(
        "the upstream read {} of {} body bytes, {} of them after the write's deadline; the answer the client got: {} bytes, ends {:?}",
        seen.body,
        body,
        seen.after_deadline,
        answer.len(),
        &answer[answer.len().saturating_sub(12)..]
    );
    assert!(seen.head_at.elapsed() > forward_timeout);
    assert!(
        seen.body < body,
        "the whole write reached the upstream although it read nothing of it until after the write's deadline"
    );
    assert!(!answer.ends_with("0\r\n\r\n"), "the answer streamed to its end, past the write's deadline");
    // What it read after the deadline is at most what its small receive buffer held before.
    assert!(seen.after_deadline <= 16 * 1024, "{} bytes of the write after its deadline", seen.after_deadline);
}

/// The same upstream answering in full at once (an early 413, kept alive) and reading the write
/// only later: the answer ends long before the write's deadline, with the rest of the write
/// still in the kernel's send queue (or TLS's buffer). A connection that went back to be used
/// again would send it later; a fenced write's connection with more than a small body is reset
/// at its answer's end instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s5_a_write_answered_in_full_before_it_was_read_leaves_nothing_to_send_later() {
    let db = TestDb::new().await;
    let forward_timeout = Duration::from_millis(1000);
    let (_gateway, mut client, seen, body) = write_to_an_early_answerer(&db, forward_timeout, true).await;
    let mut answer = vec![0_u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), client.read(&mut answer)).await.unwrap().unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 413"), "the early answer was not relayed: {answer:?}");
    let seen = tokio::time::timeout(Duration::from_secs(15), seen).await.unwrap().unwrap();
    println!(
        "the upstream read {} of {} body bytes, {} of them after the write's deadline",
        seen.body, body, seen.after_deadline
    );
    assert!(seen.body < body, "the whole write reached the upstream after its answer");
    assert!(seen.after_deadline <= 16 * 1024, "{} bytes of the write after its deadline", seen.after_deadline);
}
