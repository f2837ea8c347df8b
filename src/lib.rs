//! pushpace paces push-notification sends.
//!
//! Jobs (one notification for a list of device tokens, keyed by campaign) arrive from
//! Kafka; a scheduler shares each quantum among up to 100 active campaigns; every send
//! passes through a [`limiter::RateLimiter`] at the campaign's `send_rate`; a sender
//! delivers it; per-second counts are flushed to PostgreSQL in batches.
//!
//! Modules, in data-path order:
//! - [`broker`]: Kafka client configuration, topic creation and the embedded mock broker.
//! - [`job`]: decoding and validating job messages.
//! - [`hygiene`]: the Bloom filter in front of `invalid_tokens`: a token gone for a provider
//!   is not re-sent through it until its mark expires.
//! - [`capping`]: per-device frequency caps (count-min sketch, then an exact stage).
//! - [`limiter`]: the `RateLimiter` trait, its algorithms, clocks and the `Rate` type.
//! - [`sender`]: the `Sender` trait, the response classes, the webhook sender and the null sender.
//! - [`provider`]: the named providers (APNs, FCM HTTP v1, Web Push, webhook) and their transport.
//! - [`stats`]: lock-free per-second counters and the batched flusher.
//! - [`store`]: PostgreSQL: migrations, campaigns, delivery stats, progress, dead letters.
//!
//! Around them:
//! - [`config`]: layered settings (config/base.toml, config/<env>.toml, `PUSHPACE__*`, flags).
//! - [`telemetry`]: tracing subscriber set-up.
//! - [`worker`]: the daemon: consumer → scheduler → sender → stats, and its shutdown.
//! - [`redis_link`]: the Redis connection the leases and the shared cap keep, and its errors.
//! - [`distributed`]: `limiter.scope = "redis"`: campaign rates shared by several workers
//!   through Redis leases, with a local fallback.
//! - [`shutdown`]: the worker's stop signal, one cancellation token in ordered phases.
//! - [`api`]: the operator HTTP API and the live dashboard (axum).
//! - [`apps`]: the app registry: per-app credentials in PostgreSQL, sealed under a master
//!   key, and its store.
//! - [`metrics`]: the Prometheus recorder, the snapshot sampler and `sends_total`.
//! - [`startup`]: builds and runs the HTTP application on `http.bind`.
//! - [`prefetch`]: cache hints for loops that know what they will touch next.
//!
//! Tooling, which the worker never calls: [`tools`] (the sink, the provider mocks, the
//! load generator, the demo, the simulator, the benchmark harness and the CLI's API
//! client).

pub mod api;
pub mod apps;
pub mod broker;
pub mod capping;
pub mod config;
pub mod distributed;
pub mod hygiene;
pub mod job;
pub mod limiter;
pub mod metrics;
pub mod prefetch;
pub mod provider;
pub mod redact;
pub mod redis_link;
pub mod sender;
pub mod shutdown;
pub mod startup;
pub mod stats;
pub mod store;
pub mod telemetry;
pub mod tools;
pub mod worker;
