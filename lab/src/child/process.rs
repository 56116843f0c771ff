//! The owner's side of a child process ([`ChildProcess`]): this program started again as
//! `vkgdr bench-child ROLE ...`, its stdin a command pipe, its stdout read line by line on a
//! thread, its stderr kept for error messages. Every wait has a deadline: a child that does not
//! answer in time is killed and named in the error, and a child is never left behind (dropping
//! the handle kills and reaps it; the kernel kills it too when the thread that started it ends,
//! `PR_SET_PDEATHSIG`).

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::RawFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::protocol::{Line, ERROR, GO, QUIT};

/// What the child's environment names as its CUDA library when it must not load CUDA: a file
/// that does not exist, so any CUDA call in it fails loudly instead of passing unnoticed.
pub const NO_CUDA_LIBRARY: &str = "/nonexistent/libcuda.so.1";
/// The hidden command that runs a child's role.
pub const COMMAND: &str = "bench-child";
/// The most of a child's stderr kept for messages.
const STDERR_KEPT: usize = 4096;
/// How long a killed child may take to be reaped.
const REAP_TIMEOUT: Duration = Duration::from_secs(10);

pub use crate::bench::error::ChildError;

/// How a child is started.
#[derive(Debug, Clone)]
pub struct Spawn {
    /// Its name in messages (`xproc producer 3`).
    pub name: String,
    /// The role and its options, after `vkgdr bench-child`.
    pub args: Vec<String>,
    /// Whether the child must run without CUDA (its `VKGDR_CUDA_LIBRARY` names no file).
    pub no_cuda: bool,
    /// An fd of this process the child inherits under the same number.
    pub keep_fd: Option<RawFd>,
}

/// A running child process (see the module docs).
pub struct ChildProcess {
    name: String,
    child: Child,
    pid: u32,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    /// Protocol lines read but not yet asked for.
    backlog: VecDeque<Line>,
    /// The child's stderr (its last [`STDERR_KEPT`] bytes) and stdout lines outside the protocol.
    output: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
    /// Reader threads still running.
    reading: Arc<AtomicUsize>,
    status: Option<ExitStatus>,
    /// The child's own account of its failure (its `error` line), once read.
    error_line: Option<String>,
}

impl std::fmt::Debug for ChildProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChildProcess")
            .field("name", &self.name)
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

/// Counts a reader thread out when it ends.
struct Finished(Arc<AtomicUsize>);

impl Drop for Finished {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

fn keep(output: &Mutex<String>, what: &str) {
    let mut o = output.lock().unwrap_or_else(|p| p.into_inner());
    o.push_str(what);
    o.push('\n');
    if o.len() > STDERR_KEPT {
        let mut cut = o.len() - STDERR_KEPT;
        while !o.is_char_boundary(cut) {
            cut += 1;
        }
        o.drain(..cut);
    }
}

impl ChildProcess {
    /// Starts this executable as `vkgdr bench-child ARGS...`.
    pub fn spawn(how: Spawn) -> Result<ChildProcess, ChildError> {
        let exe = std::env::current_exe().map_err(|e| {
            ChildError(format!(
                "{}: cannot find this program to start it: {e}",
                how.name
            ))
        })?;
        let mut cmd = Command::new(&exe);
        cmd.arg(COMMAND).args(how.args.iter().map(OsString::from));
        if how.no_cuda {
            cmd.env(vkgdr::dynlib::CUDA_ENV, NO_CUDA_LIBRARY);
        }
        Self::start(how.name, cmd, how.keep_fd)
    }

    /// Starts `cmd` as the child called `name` (its stdin, stdout and stderr piped here),
    /// handing it `keep_fd`: [`spawn`](Self::spawn) with a command of its own (the tests' runs
    /// of the built binary).
    pub fn start(
        name: String,
        mut cmd: Command,
        keep_fd: Option<RawFd>,
    ) -> Result<ChildProcess, ChildError> {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: the closure runs in the child between fork and exec and calls only
        // async-signal-safe functions (setpgid, prctl, fcntl), touching no memory of the
        // parent's.
        unsafe {
            cmd.pre_exec(move || {
                // A process group of its own: a kill reaches whatever it started too.
                if libc::setpgid(0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // Killed with the thread that started it: no child outlives its owner.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some(fd) = keep_fd {
                    if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            })
        };
        let mut child = cmd.spawn().map_err(|e| {
            ChildError(format!(
                "{name}: cannot start {}: {e}",
                cmd.get_program().to_string_lossy()
            ))
        })?;
        let pid = child.id();
        let stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        let output = Arc::new(Mutex::new(String::new()));
        let reading = Arc::new(AtomicUsize::new(2));
        let (tx, lines) = channel();
        let thread = |name: &str| std::thread::Builder::new().name(name.into());
        let spawned = (|| {
            let out = Arc::clone(&output);
            let left = Arc::clone(&reading);
            let r1 = thread("vkgdr-child-out").spawn(move || {
                let _done = Finished(left);
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if Line::parse(&line).is_some() {
                        if tx.send(line).is_err() {
                            break;
                        }
                    } else {
                        keep(&out, &format!("stdout: {line}"));
                    }
                }
            })?;
            let err = Arc::clone(&output);
            let left = Arc::clone(&reading);
            let r2 = thread("vkgdr-child-err").spawn(move || {
                let _done = Finished(left);
                // Not `lines()`: a line that is not UTF-8 is kept too.
                for line in BufReader::new(stderr).split(b'\n') {
                    let Ok(line) = line else { break };
                    keep(&err, String::from_utf8_lossy(&line).trim_end());
                }
            })?;
            Ok::<_, std::io::Error>(vec![r1, r2])
        })();
        let mut me = ChildProcess {
            name,
            stdin: child.stdin.take(),
            child,
            pid,
            lines,
            backlog: VecDeque::new(),
            output,
            readers: Vec::new(),
            reading,
            status: None,
            error_line: None,
        };
        match spawned {
            Ok(readers) => me.readers = readers,
            Err(e) => {
                let _ = me.kill();
                return Err(ChildError(format!(
                    "{}: no thread to read it: {e}",
                    me.name
                )));
            }
        }
        Ok(me)
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// `NAME (pid N)`.
    pub fn who(&self) -> String {
        format!("{} (pid {})", self.name, self.pid)
    }

    /// What the child wrote on stderr (the end of it), for messages.
    fn output_tail(&self) -> String {
        let o = self.output.lock().unwrap_or_else(|p| p.into_inner());
        let o = o.trim();
        if o.is_empty() {
            String::new()
        } else {
            format!("; its output: {}", o.replace('\n', " | "))
        }
    }

    fn failed(&self, what: String) -> ChildError {
        let own = self
            .error_line
            .as_ref()
            .map(|e| format!(": {e}"))
            .unwrap_or_default();
        ChildError(format!("{} {what}{own}{}", self.who(), self.output_tail()))
    }

    /// Files a protocol line: an error line is the child's failure.
    fn file(&mut self, raw: &str) -> Result<Option<Line>, ChildError> {
        let Some(line) = Line::parse(raw) else {
            return Ok(None);
        };
        if line.kind == ERROR {
            self.error_line = Some(line.text().to_string());
            let _ = self.reap(Duration::from_secs(2));
            self.join_readers();
            return Err(self.failed("failed".into()));
        }
        Ok(Some(line))
    }

    /// Waits up to `timeout` for a line of `kind` (other lines are kept for
    /// [`next_line`](Self::next_line)). A child that fails, exits or stays silent meanwhile is
    /// an error naming it (a silent one is killed first).
    pub fn expect(&mut self, kind: &str, timeout: Duration) -> Result<Line, ChildError> {
        if let Some(i) = self.backlog.iter().position(|l| l.kind == kind) {
            return Ok(self.backlog.remove(i).expect("found"));
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(raw) => {
                    if let Some(line) = self.file(&raw)? {
                        if line.kind == kind {
                            return Ok(line);
                        }
                        self.backlog.push_back(line);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    let _ = self.kill();
                    self.join_readers();
                    return Err(self.failed(format!(
                        "said no `{kind}` within {} s: killed",
                        timeout.as_secs_f64()
                    )));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let status = self.reap(Duration::from_secs(5));
                    self.join_readers();
                    let how = match status {
                        Ok(s) => format!("exited ({s})"),
                        Err(e) => e.0,
                    };
                    return Err(self.failed(format!("{how} before it said `{kind}`")));
                }
            }
        }
    }

    /// The next protocol line if one has come, without waiting (`None`: none yet, or the child's
    /// output ended: see [`has_exited`](Self::has_exited)). An error line is the child's failure.
    pub fn next_line(&mut self) -> Result<Option<Line>, ChildError> {
        if let Some(l) = self.backlog.pop_front() {
            return Ok(Some(l));
        }
        loop {
            match self.lines.try_recv() {
                Ok(raw) => {
                    if let Some(line) = self.file(&raw)? {
                        return Ok(Some(line));
                    }
                }
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => return Ok(None),
            }
        }
    }

    /// Whether the child has exited (reaping it if so), with its status.
    pub fn has_exited(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            if let Ok(Some(s)) = self.child.try_wait() {
                self.status = Some(s);
            }
        }
        self.status
    }

    /// Writes a command line on the child's stdin.
    pub fn send(&mut self, command: &str) -> Result<(), ChildError> {
        let Some(stdin) = self.stdin.as_mut() else {
            return Err(self.failed(format!("cannot be told `{command}`: its stdin is closed")));
        };
        let sent = stdin
            .write_all(format!("{command}\n").as_bytes())
            .and_then(|()| stdin.flush());
        sent.map_err(|e| self.failed(format!("cannot be told `{command}`: {e}")))
    }

    /// Tells the child to start ([`GO`]).
    pub fn go(&mut self) -> Result<(), ChildError> {
        self.send(GO)
    }

    /// Tells the child to finish ([`QUIT`], then end of stdin) and waits up to `timeout` for it
    /// to exit with status 0; a child still running then is killed. Its stdout and stderr
    /// threads are joined (their pipes are closed once it has exited).
    pub fn finish(mut self, timeout: Duration) -> Result<(), ChildError> {
        let _ = self.send(QUIT);
        self.stdin = None;
        let status = self.reap(timeout);
        // Lines said before it exited: an error line says why it failed.
        while let Ok(raw) = self.lines.try_recv() {
            if let Some(line) = Line::parse(&raw) {
                if line.kind == ERROR {
                    self.error_line = Some(line.text().to_string());
                }
            }
        }
        self.join_readers();
        match status {
            Ok(s) if s.success() => Ok(()),
            Ok(s) => Err(self.failed(format!("exited ({s})"))),
            Err(e) => Err(e),
        }
    }

    /// Kills the child and its process group (SIGKILL) and reaps it, waiting at most 10 s; its
    /// pipes' threads are joined.
    pub fn kill(&mut self) -> Result<ExitStatus, ChildError> {
        if self.status.is_none() {
            self.kill_group();
        }
        let status = self.reap(REAP_TIMEOUT);
        if status.is_ok() {
            self.join_readers();
        }
        status
    }

    /// Waits up to `timeout` for the child to exit; kills it then (and waits up to 10 s more).
    fn reap(&mut self, timeout: Duration) -> Result<ExitStatus, ChildError> {
        let poll = |me: &mut ChildProcess, limit: Duration| -> Option<ExitStatus> {
            let t = Instant::now();
            loop {
                if let Some(s) = me.has_exited() {
                    return Some(s);
                }
                if t.elapsed() >= limit {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        if let Some(s) = poll(self, timeout) {
            return Ok(s);
        }
        self.kill_group();
        match poll(self, REAP_TIMEOUT) {
            Some(_) => Err(ChildError(format!(
                "{} did not exit within {} s: killed{}",
                self.who(),
                timeout.as_secs_f64(),
                self.output_tail()
            ))),
            None => Err(ChildError(format!(
                "{} did not exit within {} s, nor {} s after SIGKILL",
                self.who(),
                timeout.as_secs_f64(),
                REAP_TIMEOUT.as_secs()
            ))),
        }
    }

    /// SIGKILL to the child's process group (itself and whatever it started), and to the child.
    fn kill_group(&mut self) {
        if let Ok(pid) = libc::pid_t::try_from(self.pid) {
            // SAFETY: a signal to the process group the child leads (set up before its exec);
            // while it is not reaped, its pid cannot be reused.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
        let _ = self.child.kill();
    }

    /// Joins the stdout and stderr threads once the child has exited and its pipes ended; a
    /// pipe still held open by something else after 2 s is left to its thread.
    fn join_readers(&mut self) {
        if self.status.is_none() || self.readers.is_empty() {
            return;
        }
        let t = Instant::now();
        while self.reading.load(Ordering::Acquire) > 0 {
            if t.elapsed() > Duration::from_secs(2) {
                self.readers.clear();
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        if self.status.is_none() {
            self.stdin = None;
            let _ = self.kill();
        }
        self.join_readers();
    }
}

/// A fresh path for the Unix socket an owner shares its rings on (`tag` names the command): in
/// the temporary directory, or /tmp where that path would be too long for a socket address.
pub fn socket_path(tag: &str) -> std::path::PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let name = format!("vkgdr-{tag}-{}-{n}.sock", std::process::id());
    let p = std::env::temp_dir().join(&name);
    if p.as_os_str().len() < 100 {
        p
    } else {
        std::path::PathBuf::from("/tmp").join(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child that is a shell script.
    fn sh(script: &str) -> ChildProcess {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", script]);
        ChildProcess::start("test child".into(), cmd, None).expect("sh")
    }

    #[test]
    fn lines_commands_and_a_clean_exit() {
        let mut c = sh(
            r#"echo noise; echo '@vkgdr {"kind":"ready","lane":3}'; read x;
                          echo "@vkgdr {\"kind\":\"got\",\"what\":\"$x\"}";
                          echo '@vkgdr {"kind":"done","n":1}'; read y; exit 0"#,
        );
        let ready = c.expect("ready", Duration::from_secs(10)).unwrap();
        assert_eq!(ready.u64("lane"), Ok(3));
        c.go().unwrap();
        // Asked for `done` first: `got` waits in the backlog.
        assert_eq!(
            c.expect("done", Duration::from_secs(10)).unwrap().u64("n"),
            Ok(1)
        );
        assert_eq!(c.next_line().unwrap().unwrap().fields["what"], "go");
        assert_eq!(c.next_line().unwrap(), None);
        c.finish(Duration::from_secs(10)).unwrap();
    }

    #[test]
    fn a_child_that_fails_is_named_with_its_own_words_and_stderr() {
        let mut c = sh(
            r#"echo 'bad thing' >&2; echo '@vkgdr {"kind":"error","text":"attach: refused"}'; exit 1"#,
        );
        let e = c.expect("ready", Duration::from_secs(10)).unwrap_err().0;
        assert!(e.contains("test child (pid "), "{e}");
        assert!(e.contains("failed: attach: refused"), "{e}");
        // Said on stderr before it failed: the reader may or may not have it yet.
        let mut c = sh("printf 'gone early' >&2; exit 3");
        let e = c.expect("ready", Duration::from_secs(10)).unwrap_err().0;
        assert!(
            e.contains("exited (exit status: 3) before it said `ready`"),
            "{e}"
        );
        assert!(e.contains("gone early"), "{e}");
        let c = sh("read x; exit 4");
        let e = c.finish(Duration::from_secs(10)).unwrap_err().0;
        assert!(e.contains("exited (exit status: 4)"), "{e}");
    }

    #[test]
    fn a_silent_child_is_killed_at_the_deadline() {
        let t = Instant::now();
        let mut c = sh("sleep 60");
        let e = c.expect("ready", Duration::from_millis(300)).unwrap_err().0;
        assert!(e.contains("said no `ready` within 0.3 s: killed"), "{e}");
        assert!(c.has_exited().is_some(), "reaped");
        // A child that ignores `quit` is killed at the deadline too.
        let c = sh("trap '' TERM; while true; do sleep 1; done");
        let e = c.finish(Duration::from_millis(300)).unwrap_err().0;
        assert!(e.contains("did not exit within 0.3 s: killed"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(20));
    }

    #[test]
    fn killing_reaps_and_dropping_kills() {
        let mut c = sh(r#"echo '@vkgdr {"kind":"ready"}'; sleep 60"#);
        c.expect("ready", Duration::from_secs(10)).unwrap();
        let pid = c.pid();
        let status = c.kill().unwrap();
        assert!(!status.success());
        assert!(c.send("go").is_err() || c.has_exited().is_some());
        let d = sh("sleep 60");
        let other = d.pid();
        drop(d);
        for p in [pid, other] {
            assert!(
                !std::path::Path::new(&format!("/proc/{p}")).exists(),
                "pid {p} is gone and reaped"
            );
        }
    }
}
