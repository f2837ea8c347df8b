//! Loopback provider mocks over real TLS and HTTP/2, as strict as the real services
//! (ALPN h2 required, stream limits, GOAWAY, the providers' own error answers). Used by
//! the integration tests, `pushpace demo --provider apns` and `pushpace bench`, so the
//! adapters run the same code path as against APNs, FCM and Web Push.
//!
//! [`tls::TestCa`] makes the certificates; [`h2server::MockServer`] is the server every
//! provider mock plugs its [`h2server::Handler`] into.

pub mod apns;
pub mod fcm;
pub mod h2server;
pub mod seeded;
pub mod tls;
pub mod webpush;
