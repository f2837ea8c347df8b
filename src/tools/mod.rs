//! Tooling around the worker: what `pushpace demo`, `bench`, `simulate`, `produce`,
//! `sink`, `mock`, `campaign` and `stats` run, and what the tests stand up in place of
//! the providers. Nothing on the worker's data path imports from here; the imports run
//! one way, tools → worker/api → stages → limiter/sender/store.
//!
//! - [`sink`]: a loopback HTTP sink standing in for the push provider.
//! - [`mock`]: loopback APNs, FCM and Web Push servers over TLS, as strict as the real ones.
//! - [`produce`]: the load generator behind `pushpace produce`.
//! - [`demo`]: `pushpace demo`, the whole pipeline with an embedded broker and sink.
//! - [`simulate`]: the virtual-clock experiment behind `pushpace simulate`.
//! - [`bench`]: `pushpace bench`, the end-to-end benchmark harness.
//! - [`cli_client`]: the `campaign` and `stats` commands, clients of the API.

pub mod bench;
pub mod cli_client;
pub mod demo;
pub mod mock;
pub mod produce;
pub mod simulate;
pub mod sink;
