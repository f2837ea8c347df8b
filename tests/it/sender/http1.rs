//! The HTTP/1.1 pool: idle connections kept and dropped, a connection the provider
//! closed replaced, and credentials in URLs.

use super::*;

/// The lean HTTP/1.1 client with `max_idle` idle connections and `idle` idle time.
fn http1_sender(url: String, max_idle: usize, idle: Duration) -> HttpSender {
    let mut config = HttpSenderConfig::new(url);
    config.pool_max_idle_per_host = max_idle;
    config.pool_idle_timeout = idle;
    let sender = HttpSender::new(&config).unwrap();
    assert_eq!(sender.transport(), "http1");
    sender
}

#[tokio::test]
async fn http1_keeps_at_most_max_idle_connections_between_sends() {
    let sink = sink().await;
    let sender = http1_sender(sink.url(), 8, Duration::from_secs(90));
    let tokens: Vec<String> = (0..50).map(|i| format!("t{i}")).collect();
    let refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    let job = job("j-idle", "c-idle", &refs, "{}");
    let all = || futures::future::join_all((0..50).map(|i| sender.send(&job, i)));
    assert!(all().await.iter().all(SendOutcome::is_delivered));
    // One connection per send in flight; only eight wait for the next sends.
    let first = sink.connections();
    assert!(first > 8, "{first} connections for 50 concurrent sends");
    assert_eq!(sender.idle_http1_connections(), Some(8));
    // The next burst reuses the eight and opens the rest anew.
    assert!(all().await.iter().all(SendOutcome::is_delivered));
    assert!(
        sink.connections() <= first + 42,
        "{} after {first}",
        sink.connections()
    );
    assert_eq!(sender.idle_http1_connections(), Some(8));
    assert_eq!(sink.campaign("c-idle").unwrap().delivered, 100);
}

#[tokio::test]
async fn http1_does_not_reuse_a_connection_past_its_idle_time() {
    let sink = sink().await;
    let sender = http1_sender(sink.url(), 8, Duration::from_millis(100));
    let job = job("j", "c", &["a", "b", "c"], "{}");
    assert_eq!(sender.send(&job, 0).await, SendOutcome::Delivered);
    assert_eq!(sender.send(&job, 1).await, SendOutcome::Delivered);
    assert_eq!(sink.connections(), 1, "kept alive within its idle time");
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(sender.send(&job, 2).await, SendOutcome::Delivered);
    assert_eq!(sink.connections(), 2, "a new one after the idle time");
}

/// A provider that answers one request per connection and then closes it, without
/// saying so in a `Connection: close` header: the keep-alive race of every HTTP/1.1
/// client. Returns its URL and the count of connections it accepted.
async fn closing_provider() -> (String, Arc<std::sync::atomic::AtomicU64>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/push", listener.local_addr().unwrap());
    let accepted = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                // Head and the (small) body arrive together; wait for the body's end.
                while !request.ends_with(b"}") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                    .await;
                // Closed a moment after the answer, so that it is closed while idle.
                tokio::time::sleep(Duration::from_millis(10)).await;
            });
        }
    });
    (url, accepted)
}

#[tokio::test]
async fn http1_replaces_a_connection_the_provider_closed_without_a_failed_send() {
    let (url, accepted) = closing_provider().await;
    let sender = http1_sender(url, 8, Duration::from_secs(90));
    let job = job("j", "c", &["a", "b", "c", "d", "e"], "{}");
    for i in 0..5 {
        assert_eq!(
            sender.send(&job, i).await,
            SendOutcome::Delivered,
            "send {i}"
        );
        // Time for the close to arrive, as between the sends of a slow campaign.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        accepted.load(std::sync::atomic::Ordering::Relaxed),
        5,
        "one connection per send, none reused after the provider closed it"
    );
}

#[test]
fn http1_url_credentials_go_through_reqwest_and_h2c_refuses_them() {
    let config = HttpSenderConfig::new("http://user:secret@127.0.0.1:9/push");
    assert_eq!(HttpSender::new(&config).unwrap().transport(), "reqwest");
    let mut h2c = config.clone();
    h2c.http2_prior_knowledge = true;
    let e = HttpSender::new(&h2c).unwrap_err().to_string();
    assert!(e.contains("credentials"), "{e}");
    assert!(
        !e.contains("secret"),
        "the password stays out of errors: {e}"
    );
}
