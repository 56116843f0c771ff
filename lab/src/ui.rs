//! What the command shows while it works, and where its text goes.
//!
//! - **Progress** (indicatif): one line per piece of long work — a benchmark with its phase, the
//!   step it is on (method and size) and the time taken so far; the soak with its elapsed time
//!   and counters. Drawn on stderr only when both stdout and stderr are terminals and `--quiet`
//!   is not given, so logs, pipes and CI output never hold a progress bar.
//! - **Text**: [`say!`](crate::ui::say) for results (stdout; stderr under `--json`, whose stdout
//!   holds the JSON document and nothing else), [`status!`](crate::ui::status) for status lines
//!   (the same, but not under `--quiet`), [`alert!`](crate::ui::alert) for errors (stderr). Each
//!   one clears the progress lines, prints, and draws them again, so text and bars never mix on a
//!   terminal.
//!
//! The settings are process-wide ([`init`], once, from the command line); before that (unit
//! tests) text goes to stdout and no progress is drawn.

use std::borrow::Cow;
use std::io::{IsTerminal, Write};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressFinish, ProgressStyle};

/// What the command line asked for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Settings {
    /// `--json`: stdout holds one JSON document; human text goes to stderr.
    pub json: bool,
    /// `--quiet`: no progress and no status lines.
    pub quiet: bool,
}

/// Whether progress is drawn: never under `--quiet`, and only when both stdout and stderr are
/// terminals (a redirected stdout is a log or a JSON file: no bars in it, nor around it).
pub fn progress_wanted(quiet: bool, stdout_is_terminal: bool, stderr_is_terminal: bool) -> bool {
    !quiet && stdout_is_terminal && stderr_is_terminal
}

struct Ui {
    settings: Settings,
    /// Every bar lives here; its draw target is hidden when progress is off.
    multi: MultiProgress,
    /// The bar of the benchmark that runs now ([`task`]), which [`phase`] and [`step`] move.
    task: Mutex<Option<Task>>,
}

struct Task {
    bar: ProgressBar,
    label: String,
}

static UI: OnceLock<Ui> = OnceLock::new();

fn make(settings: Settings, progress: bool) -> Ui {
    let target = if progress {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    Ui {
        settings,
        multi: MultiProgress::with_draw_target(target),
        task: Mutex::new(None),
    }
}

/// Sets the process-wide settings (the first call wins).
pub fn init(settings: Settings) {
    let progress = progress_wanted(
        settings.quiet,
        std::io::stdout().is_terminal(),
        std::io::stderr().is_terminal(),
    );
    let _ = UI.set(make(settings, progress));
}

fn ui() -> &'static Ui {
    UI.get_or_init(|| make(Settings::default(), false))
}

/// The settings in force.
pub fn settings() -> Settings {
    ui().settings
}

enum Stream {
    Out,
    Err,
}

fn write(stream: Stream, text: &str) {
    let ui = ui();
    ui.multi.suspend(|| {
        // A closed pipe (`vkgdr bench all | head`) is not worth a panic: the text is dropped.
        let _ = match stream {
            Stream::Out => std::io::stdout().lock().write_all(text.as_bytes()),
            Stream::Err => std::io::stderr().lock().write_all(text.as_bytes()),
        };
    });
}

/// Human output (results): stdout, or stderr under `--json`. `text` is written as it is.
pub fn out(text: &str) {
    let stream = if ui().settings.json {
        Stream::Err
    } else {
        Stream::Out
    };
    write(stream, text);
}

/// A status line (what is being done, what was written): like [`out`], not under `--quiet`.
pub fn status_text(text: &str) {
    if !ui().settings.quiet {
        out(text);
    }
}

/// An error or warning: stderr, always.
pub fn alert_text(text: &str) {
    write(Stream::Err, text);
}

/// A document for stdout alone (JSON, a completion script): written as it is; a closed pipe
/// drops it.
pub fn document(text: &str) {
    write(Stream::Out, text);
}

/// Prints a line of results ([`out`]): stdout, or stderr under `--json`.
#[macro_export]
macro_rules! say {
    () => { $crate::ui::out("\n") };
    ($($arg:tt)*) => { $crate::ui::out(&format!("{}\n", format_args!($($arg)*))) };
}

/// Prints a status line ([`status_text`]): like `say!`, but not under `--quiet`.
#[macro_export]
macro_rules! status {
    ($($arg:tt)*) => { $crate::ui::status_text(&format!("{}\n", format_args!($($arg)*))) };
}

/// Prints an error line on stderr ([`alert_text`]).
#[macro_export]
macro_rules! alert {
    ($($arg:tt)*) => { $crate::ui::alert_text(&format!("{}\n", format_args!($($arg)*))) };
}

// The macros are imported by path (`use crate::ui::say`, `use vkgdr_lab::ui::say` in the tool),
// like the rest of this module.
pub use crate::{alert, say, status};

/// How often a bar redraws on its own (elapsed time moves while a step takes long).
const TICK: Duration = Duration::from_millis(200);

fn spinner_style() -> ProgressStyle {
    ProgressStyle::with_template("{spinner} {prefix:.bold} [{elapsed}] {wide_msg}")
        .expect("valid template")
}

fn bar_style() -> ProgressStyle {
    ProgressStyle::with_template(
        "{spinner} {prefix:.bold} [{elapsed}] {bar:24.cyan/blue} {pos}/{len} {wide_msg}",
    )
    .expect("valid template")
    .progress_chars("=> ")
}

/// A new bar of `len` steps (`0`: a spinner) drawn with the others, hidden when progress is off.
pub fn bar(prefix: impl Into<Cow<'static, str>>, len: u64, template: Option<&str>) -> ProgressBar {
    let ui = ui();
    if ui.multi.is_hidden() {
        return ProgressBar::hidden();
    }
    let style = match template {
        Some(t) => ProgressStyle::with_template(t).expect("valid template"),
        None if len == 0 => spinner_style(),
        None => bar_style(),
    };
    // Cleared however its owner ends, an early error return included.
    let bar = ui.multi.add(
        ProgressBar::new(len)
            .with_style(style)
            .with_finish(ProgressFinish::AndClear),
    );
    bar.set_prefix(prefix);
    bar.enable_steady_tick(TICK);
    bar
}

/// The bar of one piece of work (a benchmark); [`phase`] and [`step`] move it until the guard
/// drops, which clears it.
pub struct TaskGuard(());

impl Drop for TaskGuard {
    fn drop(&mut self) {
        let mut task = ui().task.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = task.take() {
            t.bar.finish_and_clear();
        }
    }
}

/// Starts the bar of a piece of work called `label` (e.g. `[2/8] copybw`).
pub fn task(label: impl Into<String>) -> TaskGuard {
    let label = label.into();
    let bar = bar(label.clone(), 0, None);
    let mut task = ui().task.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(old) = task.replace(Task { bar, label }) {
        old.bar.finish_and_clear();
    }
    TaskGuard(())
}

/// The current task enters phase `name` of `steps` steps (`0`: not counted).
pub fn phase(name: &str, steps: u64) {
    let task = ui().task.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(t) = task.as_ref() {
        if t.bar.is_hidden() {
            return;
        }
        t.bar.set_length(steps);
        t.bar.set_position(0);
        t.bar.set_message("");
        t.bar.set_prefix(format!("{} {name}", t.label));
        t.bar.set_style(if steps == 0 {
            spinner_style()
        } else {
            bar_style()
        });
    }
}

/// The current task starts its next step, described by `what` (a method and a size).
pub fn step(what: impl Into<Cow<'static, str>>) {
    let task = ui().task.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(t) = task.as_ref() {
        if t.bar.is_hidden() {
            return;
        }
        if t.bar.length().unwrap_or(0) > 0 {
            t.bar.inc(1);
        }
        t.bar.set_message(what);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_only_on_two_terminals_and_never_when_quiet() {
        assert!(progress_wanted(false, true, true));
        assert!(!progress_wanted(true, true, true));
        assert!(!progress_wanted(false, false, true), "stdout redirected");
        assert!(!progress_wanted(false, true, false), "stderr redirected");
        assert!(!progress_wanted(false, false, false));
    }

    #[test]
    fn a_hidden_ui_takes_phases_and_steps_without_a_bar() {
        // Unit tests run with the default settings: nothing drawn, and the calls are harmless.
        assert!(ui().multi.is_hidden());
        let guard = task("[1/1] test");
        phase("write", 3);
        step("BAR 1 thr · 4 KiB");
        drop(guard);
        step("after the task: ignored");
        assert!(bar("soak", 10, None).is_hidden());
    }
}
