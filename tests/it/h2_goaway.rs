//! The provider transport (`provider::h2pool`) against hypercorn, a third-party HTTP/2
//! server (from PyPI) over TLS that closes each connection after 1,000 requests with a
//! GOAWAY (its default `keep_alive_max_requests`). Thousands of APNs-style sends over
//! several connections with many streams in flight, each failed send retried as the
//! scheduler does; the server's app (scripts/hypercorn_apns.py) counts what it
//! processed. A request the pool resent by itself (refused, above the GOAWAY's last
//! stream id) must never be one the server processed: every duplicate the server saw
//! belongs to a send the pool reported as possibly processed (lost or timed out).

use bytes::Bytes;
use http::{Request, StatusCode};
use pushpace::provider::h2pool::{H2Pool, PoolConfig, TransportError};
use pushpace::provider::tls::client_config;
use std::collections::HashSet;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Devices: 6 connection closes per connection at 1,000 requests each.
const DEVICES: usize = 6_000;
/// Devices whose token ends in "gone" (answered 410): one in this many.
const GONE_EVERY: usize = 50;
/// Sends in flight at once, like a worker's provider lane.
const IN_FLIGHT: usize = 400;
/// Connections, as a production APNs pool keeps a few.
const CONNECTIONS: usize = 4;
/// The provider send timeout (the sender's default order of magnitude).
const SEND_TIMEOUT: Duration = Duration::from_secs(5);
/// Sends of one device before the test gives up on it (the scheduler keeps retrying;
/// on loopback one or two are enough).
const MAX_SENDS: u32 = 20;
/// hypercorn starts in about a second; a busy 2-core machine may take much longer.
const START_LIMIT: Duration = Duration::from_secs(60);

/// A hypercorn process serving scripts/hypercorn_apns.py over TLS on loopback.
struct Hypercorn {
    child: Child,
    url: String,
    ca_pem: String,
    _dir: tempfile::TempDir,
}

impl Drop for Hypercorn {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A CA and a `localhost` certificate it signs, as PEM: (CA, certificate, key).
fn certificates() -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca.distinguished_name
        .push(DnType::CommonName, "pushpace test CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).expect("CA certificate");
    let key = KeyPair::generate().expect("server key");
    let params = CertificateParams::new(vec!["localhost".into()]).expect("server params");
    let cert = params
        .signed_by(&key, &ca_cert, &ca_key)
        .expect("server certificate");
    (ca_cert.pem(), cert.pem(), key.serialize_pem())
}

fn start_hypercorn() -> Hypercorn {
    let (ca_pem, cert, key) = certificates();
    let dir = tempfile::tempdir().expect("temp dir");
    let (cert_file, key_file) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_file, cert).expect("write cert");
    std::fs::write(&key_file, key).expect("write key");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let app = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/hypercorn_apns.py:app");
    let child = Command::new("python3")
        .args(["-m", "hypercorn", "--bind", &format!("127.0.0.1:{port}")])
        .arg("--certfile")
        .arg(&cert_file)
        .arg("--keyfile")
        .arg(&key_file)
        .arg(app)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3 -m hypercorn (installed by scripts/services.sh)");
    let mut server = Hypercorn {
        child,
        url: format!("https://localhost:{port}"),
        ca_pem,
        _dir: dir,
    };
    let deadline = Instant::now() + START_LIMIT;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = server.child.try_wait() {
            panic!("hypercorn exited at start: {status} (is it installed?)");
        }
        assert!(Instant::now() < deadline, "hypercorn not listening");
        std::thread::sleep(Duration::from_millis(100));
    }
    server
}

fn pool(server: &Hypercorn, connections: usize) -> Arc<H2Pool> {
    H2Pool::new(PoolConfig {
        name: "hypercorn".into(),
        endpoint: server.url.parse().expect("url"),
        tls: client_config(Some(server.ca_pem.as_bytes())).expect("tls"),
        connections,
        connect_timeout: Duration::from_secs(10),
        timeout: SEND_TIMEOUT,
        one_stream_until_ok: true,
        idle_ping: Duration::from_secs(3600),
        idle_close: None,
        budget: None,
    })
    .expect("pool")
}

/// What the client saw of the run.
#[derive(Default)]
struct Client {
    /// Tokens with a send the pool reported as possibly processed (lost, timed out).
    ambiguous: HashSet<String>,
    /// Tokens answered 410, and all tokens answered.
    gone: HashSet<String>,
    answered: usize,
    lost: usize,
    timed_out: usize,
}

/// Sends to `token` until it is answered, as the scheduler retries a provider retry.
async fn deliver(pool: Arc<H2Pool>, token: String, client: Arc<Mutex<Client>>) {
    for _ in 0..MAX_SENDS {
        let request = Request::post(format!("/3/device/{token}"))
            .header("apns-topic", "com.example.app")
            .body(())
            .unwrap();
        let error = match pool.send(request, Bytes::from_static(b"{}")).await {
            Ok(answer) => {
                let mut client = client.lock().unwrap();
                client.answered += 1;
                if answer.status == StatusCode::GONE {
                    client.gone.insert(token);
                }
                return;
            }
            Err(error) => error,
        };
        let mut c = client.lock().unwrap();
        match error {
            TransportError::Lost { .. } => c.lost += 1,
            TransportError::Timeout { .. } => c.timed_out += 1,
            TransportError::Connect { retry_in_ms, .. } => {
                drop(c);
                tokio::time::sleep(Duration::from_millis(retry_in_ms)).await;
                continue;
            }
            TransportError::NotProcessed { .. } => continue,
        }
        c.ambiguous.insert(token.clone());
    }
    panic!("{token}: no answer in {MAX_SENDS} sends");
}

/// The server's counts: (requests, duplicates, repeats after 410, duplicated tokens).
async fn stats(server: &Hypercorn) -> (u64, u64, u64, Vec<String>) {
    let answer = pool(server, 1)
        .send(Request::get("/stats").body(()).unwrap(), Bytes::new())
        .await
        .expect("GET /stats");
    let v: serde_json::Value = serde_json::from_slice(&answer.body).expect("stats JSON");
    let n = |k: &str| v[k].as_u64().expect(k);
    let tokens = v["duplicated"].as_array().expect("duplicated");
    let tokens = tokens.iter().map(|t| t.as_str().unwrap().to_string());
    (
        n("requests"),
        n("duplicates"),
        n("repeats_after_410"),
        tokens.collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_closing_connections_with_goaway_gets_no_duplicate_from_the_pool() {
    let devices: usize = std::env::var("PUSHPACE_H2_GOAWAY_DEVICES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEVICES);
    let server = start_hypercorn();
    let pool = pool(&server, CONNECTIONS);
    let client = Arc::new(Mutex::new(Client::default()));
    let gate = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..devices {
        let gone = if i % GONE_EVERY == 0 { "gone" } else { "" };
        let token = format!("{i:08x}{gone}");
        let permit = gate.clone().acquire_owned().await.unwrap();
        let (pool, client) = (pool.clone(), client.clone());
        tasks.spawn(async move {
            deliver(pool, token, client).await;
            drop(permit);
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("device task");
    }
    let (requests, duplicates, repeats_after_410, duplicated) = stats(&server).await;
    let client = client.lock().unwrap();
    let counts = pool.transport_counts();
    println!(
        "hypercorn GOAWAY run: devices {devices}, connections opened {}, server requests \
         {requests}, duplicates {duplicates}, repeats after 410 {repeats_after_410}; \
         client: lost {}, timed out {}, resent by the pool {} (not processed)",
        pool.connect_attempts(),
        client.lost,
        client.timed_out,
        counts.resent,
    );
    assert_eq!(client.answered, devices, "every device answered once");
    assert_eq!(requests, devices as u64 + duplicates);
    let unexplained: Vec<&String> = duplicated
        .iter()
        .filter(|t| !client.ambiguous.contains(*t))
        .collect();
    assert!(
        unexplained.is_empty(),
        "{} of {duplicates} duplicates were resent by the pool as not processed, \
         yet the server had processed them: {:?}",
        unexplained.len(),
        &unexplained[..unexplained.len().min(10)]
    );
    // An answered 410 is never sent again: a repeat comes from an answer never read.
    assert!(duplicated
        .iter()
        .all(|t| !t.ends_with("gone") || client.ambiguous.contains(t)));
    assert!(client.gone.len() >= devices / GONE_EVERY);
}
