//! One wrapper for every child process the kit starts — the service under test, the
//! benchmark's service, the chaos run's instances and broker: its standard error read line by
//! line (kept, timestamped, optionally copied to a file and handed to a callback), signals sent
//! safely, a bounded wait for the exit, a listening socket handed over as systemd does, and a
//! kill when dropped so no test leaves a process behind.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use nix::sys::signal::Signal;

/// The file descriptor a handed-over socket gets in the child (`SD_LISTEN_FDS_START`).
const FIRST_LISTEN_FD: i32 = 3;

/// How often a bounded wait looks at the child again.
const POLL: Duration = Duration::from_millis(20);

type LineHook = Box<dyn FnMut(&str) + Send>;

/// A child process being prepared; see [`Process::command`].
pub struct ProcessBuilder {
    command: Command,
    name: String,
    log_file: Option<PathBuf>,
    on_line: Option<LineHook>,
    listener: Option<TcpListener>,
}

/// A running child process; killed (SIGKILL) and reaped when dropped. If the thread dropping it
/// is panicking — a failed test — its standard error is printed.
pub struct Process {
    child: Child,
    name: String,
    lines: Arc<Mutex<Vec<(Instant, String)>>>,
    reader: Option<JoinHandle<()>>,
    status: Option<ExitStatus>,
}

/// The child did not exit within the time given.
#[derive(Debug, thiserror::Error)]
#[error("{name} (pid {pid}) did not exit within {timeout:?}")]
pub struct StillRunning {
    pub name: String,
    pub pid: u32,
    pub timeout: Duration,
}

impl ProcessBuilder {
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.command.arg(arg);
        self
    }

    pub fn args<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(mut self, args: I) -> Self {
        self.command.args(args);
        self
    }

    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.command.env(key, value);
        self
    }

    pub fn envs<'a>(mut self, vars: impl IntoIterator<Item = &'a (String, String)>) -> Self {
        self.command
            .envs(vars.into_iter().map(|(k, v)| (k.as_str(), v.as_str())));
        self
    }

    /// Runs the child in `dir`.
    pub fn current_dir(mut self, dir: impl AsRef<Path>) -> Self {
        self.command.current_dir(dir);
        self
    }

    pub fn env_remove(mut self, key: impl AsRef<OsStr>) -> Self {
        self.command.env_remove(key);
        self
    }

    /// Standard input as a pipe, for [`Process::stdin`].
    pub fn stdin_piped(mut self) -> Self {
        self.command.stdin(Stdio::piped());
        self
    }

    /// Standard output as a pipe, for [`Process::take_stdout`]; otherwise it is discarded.
    pub fn stdout_piped(mut self) -> Self {
        self.command.stdout(Stdio::piped());
        self
    }

    /// Also copies standard error to this file as it comes.
    pub fn log_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.log_file = Some(path.into());
        self
    }

    /// Calls `hook` with every line of standard error, on the reader thread, as it comes.
    pub fn on_line(mut self, hook: impl FnMut(&str) + Send + 'static) -> Self {
        self.on_line = Some(Box::new(hook));
        self
    }

    /// Hands `listener` to the child as file descriptor 3 with `LISTEN_FDS=1`, as systemd's
    /// socket activation does: the child serves a port the caller bound (port 0 gives one the
    /// OS chose), so nothing can take the port between picking and binding it.
    pub fn hand_over(mut self, listener: TcpListener) -> Self {
        self.listener = Some(listener);
        self
    }

    pub fn spawn(mut self) -> std::io::Result<Process> {
        use command_fds::{CommandFdExt, FdMapping};
        if let Some(listener) = self.listener.take() {
            self.command
                .fd_mappings(vec![FdMapping {
                    parent_fd: listener.into(),
                    child_fd: FIRST_LISTEN_FD,
                }])
                .map_err(std::io::Error::other)?;
            self.command.env("LISTEN_FDS", "1").env_remove("LISTEN_PID");
        }
        self.command.stderr(Stdio::piped());
        let mut child = self.command.spawn().map_err(|err| {
            std::io::Error::new(err.kind(), format!("cannot start {}: {err}", self.name))
        })?;
        let stderr = child.stderr.take().expect("standard error is piped");
        let lines: Arc<Mutex<Vec<(Instant, String)>>> = Arc::default();
        let mut file = match &self.log_file {
            Some(path) => Some(std::fs::File::create(path)?),
            None => None,
        };
        let mut hook = self.on_line.take();
        let kept = lines.clone();
        let reader = std::thread::Builder::new()
            .name(format!("{}-stderr", self.name))
            .spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if let Some(file) = file.as_mut() {
                        let _ = writeln!(file, "{line}");
                    }
                    if let Some(hook) = hook.as_mut() {
                        hook(&line);
                    }
                    kept.lock().unwrap().push((Instant::now(), line));
                }
            })?;
        Ok(Process {
            child,
            name: self.name,
            lines,
            reader: Some(reader),
            status: None,
        })
    }
}

impl Process {
    /// Prepares `binary` as a child process; `name` appears in its messages.
    pub fn command(binary: impl AsRef<Path>) -> ProcessBuilder {
        let binary = binary.as_ref();
        let mut command = Command::new(binary);
        command.stdin(Stdio::null()).stdout(Stdio::null());
        ProcessBuilder {
            command,
            name: binary.file_name().map_or_else(
                || "child".into(),
                |name| name.to_string_lossy().into_owned(),
            ),
            log_file: None,
            on_line: None,
            listener: None,
        }
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Sends `signal`; a child that has already exited is not an error.
    pub fn signal(&mut self, signal: Signal) {
        if self.exit_status().is_some() {
            return;
        }
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, signal);
    }

    /// SIGTERM: the graceful stop.
    pub fn terminate(&mut self) {
        self.signal(Signal::SIGTERM);
    }

    /// SIGKILL, then reaps the child: no graceful anything.
    pub fn kill(&mut self) -> Option<ExitStatus> {
        let _ = self.child.kill();
        self.child
            .wait()
            .ok()
            .inspect(|status| self.status = Some(*status))
    }

    /// The exit status, if the child has exited.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().ok().flatten();
        }
        self.status
    }

    /// Waits for the exit, at most `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus, StillRunning> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exit_status() {
                // Everything the child wrote before it exited is read.
                if let Some(reader) = self.reader.take() {
                    let _ = reader.join();
                }
                return Ok(status);
            }
            if Instant::now() >= deadline {
                return Err(StillRunning {
                    name: self.name.clone(),
                    pid: self.id(),
                    timeout,
                });
            }
            std::thread::sleep(POLL);
        }
    }

    /// SIGTERM, then waits at most `timeout` for the exit.
    pub fn stop(&mut self, timeout: Duration) -> Result<ExitStatus, StillRunning> {
        self.terminate();
        self.wait_exit(timeout)
    }

    /// Everything the child wrote to standard error so far.
    pub fn logs(&self) -> String {
        let lines = self.lines.lock().unwrap();
        let mut text = String::new();
        for (_, line) in lines.iter() {
            text.push_str(line);
            text.push('\n');
        }
        text
    }

    /// The last `count` lines of standard error.
    pub fn log_tail(&self, count: usize) -> String {
        let lines = self.lines.lock().unwrap();
        let start = lines.len().saturating_sub(count);
        lines[start..]
            .iter()
            .map(|(_, line)| line.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// When a line containing `needle` was first written, if it was.
    pub fn seen(&self, needle: &str) -> Option<Instant> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .find(|(_, line)| line.contains(needle))
            .map(|(at, _)| *at)
    }

    /// Waits until a line containing `needle` is written (`Some(line)`), or the child exits or
    /// `timeout` passes (`None`).
    pub fn wait_for_line(&mut self, needle: &str, timeout: Duration) -> Option<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let found = self
                .lines
                .lock()
                .unwrap()
                .iter()
                .find(|(_, line)| line.contains(needle))
                .map(|(_, line)| line.clone());
            if found.is_some() {
                return found;
            }
            if self.exit_status().is_some() || Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(POLL);
        }
    }

    /// The piped standard input (see [`ProcessBuilder::stdin_piped`]).
    pub fn stdin(&mut self) -> Option<&mut ChildStdin> {
        self.child.stdin.as_mut()
    }

    /// Takes the piped standard output (see [`ProcessBuilder::stdout_piped`]).
    pub fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.child.stdout.take()
    }

    /// The peak resident set size so far, in MB (`VmHWM`); 0 once the child has exited.
    pub fn peak_rss_mb(&self) -> f64 {
        self.status_mb("VmHWM:")
    }

    /// Resident set size now, in MB (VmRSS).
    pub fn rss_mb(&self) -> f64 {
        self.status_mb("VmRSS:")
    }

    fn status_mb(&self, field: &str) -> f64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .ok()
            .and_then(|status| {
                status.lines().find_map(|line| {
                    let kb = line.strip_prefix(field)?.trim().strip_suffix("kB")?;
                    kb.trim().parse::<f64>().ok()
                })
            })
            .map_or(0.0, |kb| kb / 1024.0)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.exit_status().is_none() {
            self.kill();
        }
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        if std::thread::panicking() {
            eprintln!(
                "--- standard error of {} (pid {}) ---\n{}",
                self.name,
                self.child.id(),
                self.logs()
            );
        }
    }
}

/// A listening socket on 127.0.0.1 with a port the OS chose, to hand over to a child
/// ([`ProcessBuilder::hand_over`]) or serve in process.
pub fn local_listener() -> std::io::Result<TcpListener> {
    TcpListener::bind("127.0.0.1:0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_stops_the_child_and_its_output_is_kept() {
        let mut child = Process::command("/bin/sh")
            .args(["-c", "echo started >&2; exec sleep 30"])
            .spawn()
            .unwrap();
        assert!(
            child
                .wait_for_line("started", Duration::from_secs(10))
                .is_some()
        );
        let status = child.stop(Duration::from_secs(10)).unwrap();
        assert_eq!(status.code(), None, "killed by the signal");
        assert!(child.logs().contains("started"));
    }

    #[test]
    fn a_handed_over_listener_is_file_descriptor_three_in_the_child() {
        let listener = local_listener().unwrap();
        let port = listener.local_addr().unwrap().port();
        // The child reports the socket at fd 3 and the variables systemd would set.
        let mut child = Process::command("/bin/sh")
            .args([
                "-c",
                "echo fds=$LISTEN_FDS >&2; readlink /proc/self/fd/3 >&2; exit 7",
            ])
            .hand_over(listener)
            .spawn()
            .unwrap();
        let status = child.wait_exit(Duration::from_secs(10)).unwrap();
        assert_eq!(status.code(), Some(7));
        let logs = child.logs();
        assert!(logs.contains("fds=1"), "{logs}");
        assert!(logs.contains("socket:["), "{logs}");
        // The parent no longer holds the socket: only the (exited) child had it.
        assert!(std::net::TcpListener::bind(("127.0.0.1", port)).is_ok());
    }

    #[test]
    fn dropping_a_running_child_kills_it() {
        let child = Process::command("/bin/sh")
            .args(["-c", "exec sleep 30"])
            .spawn()
            .unwrap();
        let pid = child.id();
        drop(child);
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
    }
}
