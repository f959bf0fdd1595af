//! The listening socket and the accept loop: binding (or taking systemd's socket), its mode
//! and group, and one thread per connection once its first message arrives.
//!
//! # Design
//! - A new connection waits in the accept loop's [`Lobby`](crate::serve::lobby) (no thread, per-uid
//!   caps, a deadline) until its first message arrives; then it gets its thread. Out of fds,
//!   the loop closes a waiting connection to make room. "accept failed" lines are rate
//!   limited.
//! - A stale socket no daemon answers on is replaced; a live one is an error.
//! - Connections are counted before their thread starts, so a drain never misses one.
//!
//! # Limitations
//! - One thread per connection: ranks per host are few.

use std::os::fd::{OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::net::{AddressFamily, SocketType};
use stoker_wire::socket::groups::gid_of;
use stoker_wire::socket::{SeqPacket, SeqPacketListener, SockError};

use crate::serve::access::{AccessPolicy, Quotas};
use crate::serve::config::{LimitsConfig, ServeConfig};
use stoker_pipeline::engine::backend::BackendKind;
use stoker_pipeline::engine::{CpuBackendFactory, Engine, ExtraWorkers};
use stoker_pipeline::source::object::ObjectStore;

use super::gpus::Engines;
use crate::serve::lobby::{Arrived, Lobby};
use stoker_pipeline::metrics as m;
use stoker_pipeline::ratelimit::{Admit, RateLimit};

use super::connection::Connection;
use super::ops::{ServerHandle, ServerState};
use super::registry::Registry;
use super::{ServerError, HEARTBEAT_INTERVAL};

/// "accept failed" lines a second at most.
const ACCEPT_LOG_PER_SECOND: u32 = 2;

/// The daemon: a listening socket, the engine, the job registry.
pub(crate) struct Server {
    pub(super) listener: SeqPacketListener,
    pub(super) socket: PathBuf,
    /// False for a socket systemd passed: systemd owns the file, we leave it on drop.
    pub(super) owns_socket: bool,
    pub(super) slots: usize,
    pub(super) engines: Arc<Engines>,
    pub(super) registry: Arc<Registry>,
    pub(super) quotas: Arc<Quotas>,
    pub(super) state: Arc<ServerState>,
    /// `[limits]`: the lobby's caps and deadline.
    pub(super) limits: LimitsConfig,
    /// Rate limit of "accept failed" lines.
    pub(super) accept_log: Mutex<RateLimit>,
}

/// Binds a listening socket at `socket` whose mode and group are already the configured ones
/// when it appears there: bound under a temporary name in the same folder, given its
/// permissions, then hard-linked to `socket` (which fails, as bind would, if something is
/// there) and the temporary name removed. So no client connects before the mode is final.
fn bind_with_permissions(
    socket: &Path,
    mode: u32,
    group: Option<&str>,
) -> Result<SeqPacketListener, ServerError> {
    // No longer than "stoker.sock", so that a path that fits a socket address still does.
    let tmp = socket.with_file_name(format!(".s{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let bind_err = |source| ServerError::Bind {
        path: socket.to_owned(),
        source,
    };
    let listener = SeqPacketListener::bind(&tmp).map_err(bind_err)?;
    let placed = set_socket_permissions(&tmp, socket, mode, group).and_then(|()| {
        std::fs::hard_link(&tmp, socket)
            .map_err(|source| bind_err(SockError::Io { op: "link", source }))
    });
    let _ = std::fs::remove_file(&tmp);
    placed.map(|()| listener)
}

/// Gives the socket file `path` (named `shown` in errors) the configured mode and group (who
/// may connect is who may write it).
pub(super) fn set_socket_permissions(
    path: &Path,
    shown: &Path,
    mode: u32,
    group: Option<&str>,
) -> Result<(), ServerError> {
    use std::os::unix::fs::PermissionsExt;
    let perms_err = |source| ServerError::SocketPermissions {
        path: shown.to_owned(),
        mode,
        source,
    };
    // Never through a symlink: the path must be the socket itself (its folder is ours and
    // nobody else may write to it, so it cannot be swapped between this check and the chmod).
    use std::os::unix::fs::FileTypeExt;
    let meta = std::fs::symlink_metadata(path).map_err(perms_err)?;
    if !meta.file_type().is_socket() {
        return Err(perms_err(std::io::Error::other(
            "not the socket just bound (a symlink or another file): refused",
        )));
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(perms_err)?;
    if let Some(group) = group {
        let gid = gid_of(group).ok_or_else(|| ServerError::SocketGroup {
            path: shown.to_owned(),
            group: group.to_owned(),
        })?;
        std::os::unix::fs::lchown(path, None, Some(gid)).map_err(|e| {
            // Only root may give a file a group its owner is not in: say that, not EPERM.
            if e.raw_os_error() == Some(libc::EPERM) && !in_group(gid) {
                return ServerError::SocketGroupNotMember {
                    path: shown.to_owned(),
                    group: group.to_owned(),
                    gid,
                    uid: rustix::process::geteuid().as_raw(),
                };
            }
            perms_err(e)
        })?;
    }
    Ok(())
}

/// Whether this process has `gid` as its effective or a supplementary group.
fn in_group(gid: u32) -> bool {
    rustix::process::getegid().as_raw() == gid
        || rustix::process::getgroups()
            .unwrap_or_default()
            .iter()
            .any(|g| g.as_raw() == gid)
}

/// Why a descriptor is not the listening socket stokerd serves on.
#[derive(Debug, thiserror::Error)]
pub enum ListenerError {
    #[error("fd {fd} of LISTEN_FDS={count} is not open")]
    NotOpen { fd: RawFd, count: u64 },
    #[error("{0}")]
    Sockopt(std::io::Error),
    #[error("domain {0}, not AF_UNIX")]
    Domain(u16),
    #[error("type {0}, not SOCK_SEQPACKET")]
    Type(u32),
    #[error("not listening")]
    NotListening,
}

fn sockopt<T>(got: rustix::io::Result<T>) -> Result<T, ListenerError> {
    got.map_err(|e| ListenerError::Sockopt(e.into()))
}

/// Checks `fd` is an AF_UNIX SOCK_SEQPACKET socket in the listening state.
pub(crate) fn check_seqpacket_listener(fd: &OwnedFd) -> Result<(), ListenerError> {
    use rustix::net::sockopt;
    let domain = sockopt(sockopt::socket_domain(fd))?;
    let ty = sockopt(sockopt::socket_type(fd))?;
    let listening = sockopt(sockopt::socket_acceptconn(fd))?;
    if domain != AddressFamily::UNIX {
        return Err(ListenerError::Domain(domain.as_raw()));
    }
    if ty != SocketType::SEQPACKET {
        return Err(ListenerError::Type(ty.as_raw()));
    }
    if !listening {
        return Err(ListenerError::NotListening);
    }
    Ok(())
}

impl Server {
    /// Starts the engine and listens at the config's socket ([`ServeConfig::socket`]),
    /// creating its directory and replacing a stale socket no daemon answers on. `config` has
    /// been validated (with the command line's overrides applied); `backend` serves ranks that
    /// name a GPU (`Cuda`) or refuses them (`Cpu`).
    /// `extra` are more takers of the CPU engine's units (remote workers' connections).
    pub(crate) fn bind(
        config: &ServeConfig,
        backend: BackendKind,
        extra: &[ExtraWorkers<'_>],
    ) -> Result<Server, ServerError> {
        let socket = config.socket.clone();
        if let Some(dir) = socket.parent().filter(|d| !d.as_os_str().is_empty()) {
            // Ours, and nobody else may write to it: else another user could put their
            // own socket (or a symlink) where clients look for ours.
            stoker_private::create_dir(dir).map_err(|e| ServerError::SocketDir {
                path: dir.to_owned(),
                source: std::io::Error::other(e),
            })?;
        }
        if std::fs::symlink_metadata(&socket).is_ok() {
            match SeqPacket::connect(&socket) {
                Ok(_) => return Err(ServerError::InUse(socket)),
                Err(_) => {
                    tracing::info!(socket = %socket.display(), "removing stale socket");
                    let _ = std::fs::remove_file(&socket);
                }
            }
        }
        let listener = bind_with_permissions(
            &socket,
            config.server.socket_mode,
            config.server.socket_group.as_deref(),
        )?;
        Server::with_listener(listener, socket, true, config, backend, extra)
    }

    /// Serves on a listening socket systemd passed (socket activation), after checking it is
    /// a listening unix SOCK_SEQPACKET socket. `socket` names it in logs and status.
    pub(crate) fn from_activated(
        fd: OwnedFd,
        socket: PathBuf,
        config: &ServeConfig,
        backend: BackendKind,
        extra: &[ExtraWorkers<'_>],
    ) -> Result<Server, ServerError> {
        check_seqpacket_listener(&fd).map_err(ServerError::Activated)?;
        Server::with_listener(
            SeqPacketListener::from_fd(fd),
            socket,
            false,
            config,
            backend,
            extra,
        )
    }

    pub(super) fn with_listener(
        listener: SeqPacketListener,
        socket: PathBuf,
        owns_socket: bool,
        config: &ServeConfig,
        backend: BackendKind,
        extra: &[ExtraWorkers<'_>],
    ) -> Result<Server, ServerError> {
        let engine = config.engine.clone();
        config.limits.apply_entry_limits();
        let cpu = Engine::with_backends(engine.clone(), &CpuBackendFactory, extra)?;
        let engines = Arc::new(Engines::new(cpu, backend, engine));
        let registry = Arc::new(Registry {
            jobs: Mutex::default(),
            opening: Mutex::default(),
            access: RwLock::new(
                AccessPolicy::new(&config.access, &config.datasets).map_err(ServerError::Access)?,
            ),
            max_jobs: config.limits.max_jobs,
            max_jobs_per_uid: config.limits.jobs_per_uid(),
            walk: config.limits.walk(),
            objects: ObjectStore::new(&config.s3, &config.datasets),
            indexes: Mutex::default(),
        });
        let state = Arc::new(ServerState::new().map_err(ServerError::Wake)?);
        state.beat();
        Ok(Server {
            listener,
            socket,
            owns_socket,
            slots: config.server.slots_per_rank,
            engines,
            registry,
            quotas: Quotas::new(config.limits.clone()),
            state,
            limits: config.limits.clone(),
            accept_log: Mutex::new(RateLimit::new(ACCEPT_LOG_PER_SECOND)),
        })
    }

    pub(crate) fn socket_path(&self) -> &Path {
        &self.socket
    }

    /// What signals, the watchdog, status and metrics hold of this server.
    pub(crate) fn handle(&self) -> ServerHandle {
        ServerHandle {
            state: Arc::clone(&self.state),
            registry: Arc::clone(&self.registry),
            engines: Arc::clone(&self.engines),
            quotas: Arc::clone(&self.quotas),
            socket: self.socket.clone(),
            activated: !self.owns_socket,
        }
    }

    /// Accepts clients until [`ServerHandle::stop`] (then returns `Ok`) or accepting fails.
    pub(crate) fn serve(&self) -> Result<(), ServerError> {
        tracing::info!(
            socket = %self.socket.display(),
            slots = self.slots,
            threads = self.engines.cpu.threads(),
            backend = self.engines.cpu.backend().name(),
            "stokerd serving"
        );
        let mut next_id: u64 = 0;
        // Connections that have not sent their first message wait here, without a thread.
        let mut lobby = Lobby::new(&self.limits);
        loop {
            self.state.beat();
            if self.state.stopping() {
                tracing::info!("no longer accepting connections (stopping)");
                return Ok(());
            }
            if self.wait_for_client(&mut lobby)? == Woke::Heartbeat {
                continue;
            }
            let conn = match self.listener.accept() {
                Ok(c) => c,
                Err(e) if is_fd_exhaustion(&e) => {
                    // Make room by closing a waiting connection; else wait for fds to free.
                    if !lobby.evict_one() {
                        self.warn_accept(&e);
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    continue;
                }
                Err(e) if is_transient_accept(&e) => {
                    self.warn_accept(&e);
                    // Back off a little: the cause (no memory) needs time to clear.
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                Err(e) => return Err(ServerError::Accept(e)),
            };
            next_id += 1;
            ::metrics::counter!(m::CONNECTIONS_TOTAL).increment(1);
            lobby.admit(next_id, conn);
        }
    }

    /// Logs a failed accept, at most a few lines a second.
    fn warn_accept(&self, e: &SockError) {
        let mut log = self.accept_log.lock().unwrap_or_else(|p| p.into_inner());
        if let Admit::Log { suppressed } = log.admit(Instant::now()) {
            tracing::warn!(error = %e, suppressed, "accept failed; going on");
        }
    }

    /// Blocks until a client connects, a waiting connection's first message arrives (its
    /// thread is started) or its deadline passes, the server stops, or the heartbeat is due.
    fn wait_for_client(&self, lobby: &mut Lobby) -> Result<Woke, ServerError> {
        // The listener first, then the lobby's connections, then the stop event last.
        let mut pfds = lobby.poll_fds(&self.listener);
        pfds.push(PollFd::new(&self.state.stop_event, PollFlags::IN));
        // A wait too long for a timespec (it is at most the heartbeat) waits forever.
        let timeout = Timespec::try_from(lobby.timeout(HEARTBEAT_INTERVAL)).ok();
        match rustix::event::poll(&mut pfds, timeout.as_ref()) {
            Ok(_) => {}
            Err(Errno::INTR) => return Ok(Woke::Heartbeat),
            Err(e) => {
                return Err(ServerError::Accept(SockError::Io {
                    op: "poll",
                    source: e.into(),
                }))
            }
        }
        let polled: Vec<PollFlags> = pfds.iter().map(PollFd::revents).collect();
        drop(pfds);
        for arrived in lobby.sort_out(&polled) {
            self.spawn_connection(arrived);
        }
        let stopped = polled.last().is_some_and(|p| !p.is_empty());
        Ok(if polled[0].contains(PollFlags::IN) && !stopped {
            Woke::Client
        } else {
            Woke::Heartbeat
        })
    }

    /// Serves a connection whose first message has arrived on a thread of its own.
    fn spawn_connection(&self, arrived: Arrived) {
        let Arrived { id, sock, peer } = arrived;
        let ctx = Connection {
            id,
            handle: self.handle(),
            slots: self.slots,
        };
        // Counted before the thread starts, so a drain never misses it.
        self.state.connection_opened();
        let spawned = std::thread::Builder::new()
            .name(format!("stoker-conn-{id}"))
            .spawn(move || {
                let state = Arc::clone(&ctx.handle.state);
                ctx.run(sock, peer);
                state.connection_closed();
            });
        if let Err(e) = spawned {
            self.state.connection_closed();
            tracing::error!(conn = id, error = %e, "cannot start a connection thread");
        }
    }
}

/// Why the accept loop's wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Woke {
    /// A client is waiting to be accepted.
    Client,
    /// Nothing to accept: the heartbeat is due, the lobby moved, or the server stops (the
    /// loop looks at the flag).
    Heartbeat,
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.owns_socket {
            let _ = std::fs::remove_file(&self.socket);
        }
    }
}

fn is_fd_exhaustion(e: &SockError) -> bool {
    let errno = e.raw_os_error().map(Errno::from_raw_os_error);
    matches!(errno, Some(Errno::MFILE | Errno::NFILE))
}

pub(super) fn is_transient_accept(e: &SockError) -> bool {
    let errno = e.raw_os_error().map(Errno::from_raw_os_error);
    matches!(
        errno,
        Some(
            Errno::CONNABORTED
                | Errno::MFILE
                | Errno::NFILE
                | Errno::NOBUFS
                | Errno::NOMEM
                | Errno::PROTO
                | Errno::PERM
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_socket_mode_is_never_set_through_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("victim");
        std::fs::write(&target, b"not a socket").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = dir.path().join("stoker.sock");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let err = set_socket_permissions(&link, &link, 0o666, None).unwrap_err();
        assert!(err.to_string().contains("not the socket"), "{err}");
        let mode = std::fs::metadata(&target).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the symlink's target was changed");
    }
}
