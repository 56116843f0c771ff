//! The system calls of sharing: `SOCK_SEQPACKET` Unix sockets carrying one message and its fds
//! per packet, peer credentials, pidfds and `poll`, each failure named in
//! [`Error::System`](crate::Error::System).

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags};
use rustix::io::Errno;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketAddrUnix,
};

use crate::core::share::wire::{self, Message, MAX_FDS, MAX_MESSAGE};
use crate::core::share::ShareError;
use crate::error::{Error, Result};

/// `call` failed with `e`, in the crate's words.
pub(crate) fn sys(call: &'static str) -> impl FnOnce(Errno) -> Error {
    move |e| Error::System {
        call,
        errno: crate::driver::errno_text(e.raw_os_error()),
    }
}

/// One end of a connection: a connected `SOCK_SEQPACKET` socket.
#[derive(Debug)]
pub(crate) struct Connection {
    fd: OwnedFd,
}

/// What a peer is, by the kernel's word (`SO_PEERCRED` at connection time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCredentials {
    /// The peer's process ID.
    pub pid: i32,
    /// Its effective user ID.
    pub uid: u32,
    /// Its effective group ID.
    pub gid: u32,
}

impl Connection {
    /// Connects to the owner listening at `path`.
    pub(crate) fn connect(path: &Path) -> Result<Connection> {
        let addr = SocketAddrUnix::new(path).map_err(sys("socket path"))?;
        let fd = socket()?;
        rustix::net::connect(&fd, &addr).map_err(sys("connect"))?;
        Ok(Connection { fd })
    }

    pub(crate) fn from_fd(fd: OwnedFd) -> Connection {
        Connection { fd }
    }

    /// The other end's process, uid and gid.
    pub(crate) fn peer_credentials(&self) -> Result<PeerCredentials> {
        let c = rustix::net::sockopt::socket_peercred(&self.fd).map_err(sys("SO_PEERCRED"))?;
        Ok(PeerCredentials {
            pid: c.pid.as_raw_nonzero().get(),
            uid: c.uid.as_raw(),
            gid: c.gid.as_raw(),
        })
    }

    /// Sends `m` with `fds` (exactly the fds its kind carries) as one packet. With `wait` false
    /// a full socket buffer (a peer that does not read) is an error instead of a wait.
    pub(crate) fn send(&self, m: &Message, fds: &[BorrowedFd<'_>], wait: bool) -> Result<()> {
        if fds.len() != m.fd_count() {
            return Err(ShareError::FdCount {
                what: m.name(),
                expected: m.fd_count(),
                got: fds.len(),
            }
            .into());
        }
        let bytes = wire::encode(m);
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
            return Err(Error::internal("ancillary buffer too small for the fds"));
        }
        let flags = if wait {
            SendFlags::NOSIGNAL
        } else {
            SendFlags::NOSIGNAL | SendFlags::DONTWAIT
        };
        let n = rustix::net::sendmsg(&self.fd, &[IoSlice::new(&bytes)], &mut control, flags)
            .map_err(|e| match e {
                Errno::PIPE | Errno::CONNRESET => ShareError::Disconnected.into(),
                e => sys("sendmsg")(e),
            })?;
        if n != bytes.len() {
            return Err(Error::internal("a seqpacket send was cut short"));
        }
        Ok(())
    }

    /// Receives one message and its fds, waiting up to `timeout` (`None`: for ever). A hang-up
    /// is [`ShareError::Disconnected`]; a message that is cut short, carries more fds than any
    /// message does, or fails [`wire::decode`] is refused by name, its fds closed.
    pub(crate) fn recv(&self, timeout: Option<Duration>) -> Result<(Message, Vec<OwnedFd>)> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(d) = deadline {
                let left = d.saturating_duration_since(Instant::now());
                if !wait_readable(self.fd.as_fd(), Some(left))? {
                    return Err(ShareError::Timeout {
                        millis: timeout.unwrap_or_default().as_millis() as u64,
                    }
                    .into());
                }
            }
            match self.recv_now(true)? {
                Some(got) => return Ok(got),
                None => continue,
            }
        }
    }

    /// Receives a message if one is waiting (never blocks).
    pub(crate) fn try_recv(&self) -> Result<Option<(Message, Vec<OwnedFd>)>> {
        self.recv_now(false)
    }

    fn recv_now(&self, block: bool) -> Result<Option<(Message, Vec<OwnedFd>)>> {
        let mut buf = [0u8; MAX_MESSAGE];
        // Room for one more fd than any message carries, so an excess shows as a count, not a
        // cut-short control message.
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS + 1))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let mut flags = RecvFlags::CMSG_CLOEXEC;
        if !block {
            flags |= RecvFlags::DONTWAIT;
        }
        let got = match rustix::net::recvmsg(
            &self.fd,
            &mut [IoSliceMut::new(&mut buf)],
            &mut control,
            flags,
        ) {
            Ok(r) => r,
            Err(Errno::AGAIN) if !block => return Ok(None),
            Err(Errno::INTR) => return Ok(None),
            Err(Errno::CONNRESET) => return Err(ShareError::Disconnected.into()),
            Err(e) => return Err(sys("recvmsg")(e)),
        };
        let mut fds = Vec::new();
        for message in control.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = message {
                fds.extend(received);
            }
        }
        if got.bytes == 0 {
            return Err(ShareError::Disconnected.into());
        }
        if got.flags.contains(ReturnFlags::TRUNC) {
            return Err(ShareError::Truncated {
                what: "packet",
                need: MAX_MESSAGE + 1,
                got: MAX_MESSAGE,
            }
            .into());
        }
        if got.flags.contains(ReturnFlags::CTRUNC) {
            return Err(ShareError::FdCount {
                what: "message",
                expected: MAX_FDS,
                got: MAX_FDS + 1,
            }
            .into());
        }
        let m = wire::decode(&buf[..got.bytes], fds.len())?;
        Ok(Some((m, fds)))
    }

    pub(crate) fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

fn socket() -> Result<OwnedFd> {
    rustix::net::socket_with(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::SEQPACKET,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )
    .map_err(sys("socket"))
}

/// A listening socket at `path` with permissions `mode` (set before `listen`, so no peer can
/// connect while the file still has the umask's). An existing socket file at `path` is
/// replaced only if nothing listens on it any more.
pub(crate) fn listen(path: &Path, mode: u32) -> Result<OwnedFd> {
    let addr = SocketAddrUnix::new(path).map_err(sys("socket path"))?;
    // Non-blocking: the service thread polls it and accepts until none is waiting.
    let fd = rustix::net::socket_with(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::SEQPACKET,
        rustix::net::SocketFlags::CLOEXEC | rustix::net::SocketFlags::NONBLOCK,
        None,
    )
    .map_err(sys("socket"))?;
    match rustix::net::bind(&fd, &addr) {
        Ok(()) => {}
        Err(Errno::ADDRINUSE) if is_stale(path) => {
            rustix::fs::unlink(path).map_err(sys("unlink"))?;
            rustix::net::bind(&fd, &addr).map_err(sys("bind"))?;
        }
        Err(e) => return Err(sys("bind")(e)),
    }
    if let Err(e) = rustix::fs::chmod(path, rustix::fs::Mode::from_raw_mode(mode)) {
        let _ = rustix::fs::unlink(path);
        return Err(sys("chmod")(e));
    }
    if let Err(e) = rustix::net::listen(&fd, 64) {
        let _ = rustix::fs::unlink(path);
        return Err(sys("listen")(e));
    }
    Ok(fd)
}

/// Whether the socket file at `path` is left over: a socket nobody listens on.
fn is_stale(path: &Path) -> bool {
    let is_socket = rustix::fs::lstat(path)
        .map(|st| rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Socket)
        .unwrap_or(false);
    is_socket && matches!(Connection::connect(path), Err(Error::System { .. }))
}

/// Accepts one waiting connection (the listener is polled first; `None` if none is waiting).
pub(crate) fn accept(listener: BorrowedFd<'_>) -> Result<Option<Connection>> {
    // The listener is non-blocking; the accepted socket is not (receives wait through `poll`,
    // sends to peers pass `MSG_DONTWAIT`).
    match rustix::net::accept_with(listener, rustix::net::SocketFlags::CLOEXEC) {
        Ok(fd) => Ok(Some(Connection::from_fd(fd))),
        Err(Errno::AGAIN) | Err(Errno::INTR) | Err(Errno::CONNABORTED) => Ok(None),
        Err(e) => Err(sys("accept")(e)),
    }
}

/// A pidfd of process `pid` (`None` where the kernel has none: it is a second way to notice a
/// peer's death, the socket's hang-up being the first).
pub(crate) fn pidfd(pid: i32) -> Option<OwnedFd> {
    let pid = rustix::process::Pid::from_raw(pid)?;
    rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()
}

/// Waits up to `timeout` for `fd` to be readable (or hung up). True when it is.
pub(crate) fn wait_readable(fd: BorrowedFd<'_>, timeout: Option<Duration>) -> Result<bool> {
    let mut fds = [PollFd::from_borrowed_fd(fd, PollFlags::IN)];
    let ready = poll_fds(&mut fds, timeout)?;
    Ok(ready > 0)
}

/// `poll` over `fds` for up to `timeout` (`None`: for ever); an interrupted wait counts as
/// nothing ready.
pub(crate) fn poll_fds(fds: &mut [PollFd<'_>], timeout: Option<Duration>) -> Result<usize> {
    let ts = timeout.map(|t| rustix::event::Timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as i64,
        tv_nsec: t.subsec_nanos() as _,
    });
    match poll(fds, ts.as_ref()) {
        Ok(n) => Ok(n),
        Err(Errno::INTR) => Ok(0),
        Err(e) => Err(sys("poll")(e)),
    }
}
