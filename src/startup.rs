//! Builds and runs the HTTP application (zero2prod style): [`Application::build`] binds
//! `http.bind` (port 0 picks a free port, for tests), [`Application::port`] tells which,
//! and [`Application::run_until_stopped`] serves until its [`Stopper`] fires, finishing
//! the requests in progress. Requests must name the bound address (or a host in
//! `http.allowed_hosts`) in their `Host` header; see [`crate::api::auth`].
//!
//! The API runs next to the worker in `pushpace run`, or alone (no worker: tests of the
//! endpoints, or a read-only operator view of the database).

use crate::api::{self, AppState, WorkerView};
use crate::config::Settings;
use sqlx::PgPool;
use std::net::SocketAddr;
use tokio_util::sync::CancellationToken;

/// Errors starting or running the HTTP server.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error("http.bind {addr}: cannot listen: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("http server: {0}")]
    Serve(std::io::Error),
    #[error("http server task: {0}")]
    Task(String),
    #[error("http.allowed_hosts: {0}")]
    Hosts(String),
}

/// What the application serves from.
pub struct AppDeps {
    pub pool: PgPool,
    /// The running worker's snapshots; `None` when the API runs alone.
    pub worker: Option<WorkerView>,
    /// The broker the readiness check pings; `None` means `kafka.brokers`. Give the
    /// embedded broker's real address when `kafka.brokers = "embedded"`.
    pub bootstrap: Option<String>,
}

/// Stops a running [`Application`]; cheap to clone.
#[derive(Clone, Debug)]
pub struct Stopper(CancellationToken);

impl Stopper {
    pub fn stop(&self) {
        self.0.cancel();
    }
}

/// A bound, not yet serving, HTTP application.
pub struct Application {
    listener: tokio::net::TcpListener,
    addr: SocketAddr,
    router: axum::Router,
    stop: CancellationToken,
    sampler: Option<tokio::task::JoinHandle<()>>,
}

impl Application {
    /// Installs the metrics recorder (if no one has), starts the metrics sampler when
    /// there is a worker, and binds `settings.http.bind`.
    pub async fn build(settings: &Settings, deps: AppDeps) -> Result<Application, StartupError> {
        let metrics = match crate::metrics::install() {
            Ok(h) => Some(h),
            Err(e) => {
                tracing::warn!(error = %e, "GET /metrics will serve only sends_total");
                None
            }
        };
        let stop = CancellationToken::new();
        let sampler = deps.worker.as_ref().map(|w| {
            crate::metrics::spawn_sampler(w.scheduler.clone(), w.consumer.clone(), stop.clone())
        });
        let bootstrap = deps
            .bootstrap
            .unwrap_or_else(|| settings.kafka.brokers.clone());
        let state = AppState::new(deps.pool, settings, bootstrap, deps.worker, metrics);

        let bind = settings.http.bind;
        let listener = tokio::net::TcpListener::bind(bind)
            .await
            .map_err(|source| StartupError::Bind { addr: bind, source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| StartupError::Bind { addr: bind, source })?;
        // The real port (http.bind may ask for 0) is the one a Host header must name.
        let hosts = api::auth::AllowedHosts::new(addr, &settings.http.allowed_hosts)
            .map_err(StartupError::Hosts)?;
        let router = api::router(state, hosts);
        if !addr.ip().is_loopback() {
            tracing::warn!(%addr, "the HTTP API listens beyond loopback: put it behind TLS and a firewall");
        }
        if settings.http.admin_token().is_none() {
            tracing::info!(
                "no http.admin_token: the API is read-only (set {} to allow changes)",
                api::error::TOKEN_ENV
            );
        }
        tracing::info!(%addr, "HTTP API listening (dashboard at /)");
        Ok(Application {
            listener,
            addr,
            router,
            stop,
            sampler,
        })
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn address(&self) -> SocketAddr {
        self.addr
    }

    /// A handle that makes [`Application::run_until_stopped`] return.
    pub fn stopper(&self) -> Stopper {
        Stopper(self.stop.clone())
    }

    /// Serves until stopped; requests in progress finish first.
    pub async fn run_until_stopped(self) -> Result<(), StartupError> {
        let served = axum::serve(self.listener, self.router)
            .with_graceful_shutdown(self.stop.clone().cancelled_owned())
            .await;
        self.stop.cancel();
        if let Some(sampler) = self.sampler {
            let _ = sampler.await;
        }
        served.map_err(StartupError::Serve)
    }

    /// Runs on a task of its own; for `pushpace run` and tests.
    pub fn spawn(self) -> RunningApplication {
        let port = self.port();
        let stopper = self.stopper();
        let task = tokio::spawn(self.run_until_stopped());
        RunningApplication {
            port,
            stopper,
            task,
        }
    }
}

/// An [`Application`] serving on its own task.
pub struct RunningApplication {
    pub port: u16,
    pub stopper: Stopper,
    task: tokio::task::JoinHandle<Result<(), StartupError>>,
}

impl RunningApplication {
    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Stops serving and waits until the server has finished.
    pub async fn stop(self) -> Result<(), StartupError> {
        self.stopper.stop();
        self.task
            .await
            .map_err(|e| StartupError::Task(e.to_string()))?
    }
}
