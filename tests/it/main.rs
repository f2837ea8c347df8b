//! pushpace's integration tests: one crate, one binary, against the real services.

mod api;
mod apns;
mod bad_input;
mod broker;
mod browser;
mod capping;
mod cli;
mod dead_letters;
mod distributed;
mod fcm;
mod helpers;
mod hygiene;
mod job;
mod limiter;
mod pipeline;
mod poison_headers;
mod progress;
mod provider_transport;
mod providers_cli;
mod providers_e2e;
mod reliability;
mod sender;
mod store;
mod totals;
mod watcher;
mod webpush;
