//! Builds programs from their published Go modules, once, into the cache: a throwaway module in
//! a work folder requires the program's module at a pinned version (with `replace` lines where
//! the module needs them, as `k8s.io/kubernetes` does for its staging modules), then `go build`
//! writes the binaries, statically linked (`CGO_ENABLED=0`) and `-trimpath`. The go command
//! fetches and verifies every module through the Go module proxy and its checksum database.
//!
//! The cache folder is named by the program and version (and [`RECIPE`]), so another version
//! is another folder, and a folder is only ever complete: the build writes beside it and
//! renames. Several processes may ask at once (parallel test binaries): the build runs under a
//! file lock and the others wait for it.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::SandboxError;
use super::machine::{FileLock, Progress, is_executable, which};

/// Bumped whenever the recipe changes (flags, layout), so older caches are not reused.
pub const RECIPE: &str = "r1";

/// The oldest go command that fetches the toolchain a module asks for by itself (Go 1.21).
const OLDEST_GO_MINOR: u32 = 21;

/// One program (or several from one module) to build.
pub struct GoBuild {
    /// The cache folder's name, e.g. `kubernetes-v1.37.2`.
    pub name: String,
    /// What progress messages call it, e.g. `kube-apiserver, … (Kubernetes v1.37.2)`.
    pub what: String,
    /// `package@version` for each main package, as `go get` takes them.
    pub packages: Vec<(String, String)>,
    /// `module => module version` lines for the throwaway go.mod, worked out only when a build
    /// runs (reading them may ask the Go module proxy; a cached build needs no Go at all).
    pub replaces: Replaces,
    /// `-X name=value` settings (versions the projects' own build scripts stamp in).
    pub stamps: Vec<String>,
    /// The binaries the build must leave, by name.
    pub binaries: Vec<String>,
    /// Binaries to rename after the build: go names a binary after its package's last path
    /// element other than a major version (`go.etcd.io/etcd/server/v3` gives `server`).
    pub renames: Vec<(String, String)>,
    /// How long it takes on this project's machines (2 cores), for the person waiting.
    pub estimate: &'static str,
    /// `(binary, arguments, line it must print)`: run on the fresh build before it is cached,
    /// so a binary that does not run here, or is of another version, is never kept.
    pub checks: Vec<(String, Vec<String>, String)>,
}

/// Works out the `replace` lines of a build's throwaway go.mod with the go command given.
pub type Replaces = Box<dyn Fn(&Go) -> Result<Vec<(String, String)>, SandboxError> + Send + Sync>;

/// No `replace` lines.
pub fn no_replaces() -> Replaces {
    Box::new(|_| Ok(Vec::new()))
}

impl GoBuild {
    /// The folder holding the built binaries: found in the cache, or built first.
    pub fn ensure(
        &self,
        cache_dir: &Path,
        progress: &dyn Progress,
    ) -> Result<PathBuf, SandboxError> {
        let builds = cache_dir.join("builds");
        let target = builds.join(format!("{}-{RECIPE}", self.name));
        if self.is_complete(&target) {
            return Ok(target);
        }
        fs::create_dir_all(&builds).map_err(|e| SandboxError::io(&builds, e))?;
        let lock = builds.join(format!(".{}.lock", self.name));
        let _lock = FileLock::acquire(&lock, progress, &format!("building {}", self.what))?;
        if self.is_complete(&target) {
            return Ok(target); // another process built it while we waited
        }
        self.build(&builds, &target, progress)?;
        if self.is_complete(&target) {
            return Ok(target);
        }
        Err(SandboxError::Build(format!(
            "{} is incomplete after the build",
            target.display()
        )))
    }

    fn is_complete(&self, target: &Path) -> bool {
        self.binaries.iter().all(|b| is_executable(&target.join(b)))
    }

    fn build(
        &self,
        builds: &Path,
        target: &Path,
        progress: &dyn Progress,
    ) -> Result<(), SandboxError> {
        let go = find_go()?;
        let work = builds.join(format!("{}.work", self.name));
        let _ = fs::remove_dir_all(&work);
        fs::create_dir_all(&work).map_err(|e| SandboxError::io(&work, e))?;
        progress.step(&format!(
            "building {} from its Go module with {} ({}, once; cached in {})",
            self.what,
            go.version,
            self.estimate,
            target.display()
        ));
        let started = Instant::now();
        let replaces = (self.replaces)(&go)?;
        fs::write(work.join("go.mod"), go_mod(&replaces))
            .map_err(|e| SandboxError::io(&work, e))?;
        progress.step("  fetching the modules through the Go module proxy");
        let mut get = go.command(&work);
        get.arg("get")
            .args(self.packages.iter().map(|(p, v)| format!("{p}@{v}")));
        run_go(&mut get, &work.join("get.log"), "go get", progress)?;

        let output = work.join("bin");
        let mut build = go.command(&work);
        build
            .args(["build", "-v", "-trimpath"])
            .arg(format!("-ldflags=-s -w {}", self.stamps.join(" ")))
            .arg("-o")
            .arg(format!("{}/", output.display()))
            .args(self.packages.iter().map(|(p, _)| p));
        run_go(&mut build, &work.join("build.log"), "go build", progress)?;
        for (built, name) in &self.renames {
            fs::rename(output.join(built), output.join(name))
                .map_err(|e| SandboxError::io(&output.join(built), e))?;
        }
        self.check(&output)?;

        let info = format!(
            "{}\nbuilt with {} in {}s by previewd (src/sandbox/go_build.rs), recipe {RECIPE}\n\ngo.mod:\n{}",
            self.what,
            go.version,
            started.elapsed().as_secs(),
            fs::read_to_string(work.join("go.mod")).unwrap_or_default()
        );
        fs::write(output.join("BUILD-INFO"), info).map_err(|e| SandboxError::io(&output, e))?;
        let _ = fs::remove_dir_all(target);
        fs::rename(&output, target).map_err(|e| SandboxError::io(target, e))?;
        let _ = fs::remove_dir_all(&work);
        progress.step(&format!(
            "built {} in {}s, cached in {}",
            self.what,
            started.elapsed().as_secs(),
            target.display()
        ));
        Ok(())
    }

    /// Runs each check on the fresh build: it must run and print its line.
    fn check(&self, output: &Path) -> Result<(), SandboxError> {
        for (binary, args, expected) in &self.checks {
            let program = output.join(binary);
            let ran = Command::new(&program).args(args).output();
            let printed = ran
                .as_ref()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            if !printed.lines().any(|line| line.trim() == expected) {
                return Err(SandboxError::Build(format!(
                    "the fresh {binary} does not print {expected:?} for `{binary} {}` ({}): nothing was cached",
                    args.join(" "),
                    match &ran {
                        Ok(_) => format!("it printed {printed:?}"),
                        Err(e) => e.to_string(),
                    }
                )));
            }
        }
        Ok(())
    }
}

/// The throwaway module: no code of its own, only what it requires (added by `go get`) and how
/// it pins the modules its requirements replace.
fn go_mod(replaces: &[(String, String)]) -> String {
    let mut text = String::from(
        "// Written by previewd to build pinned tools; see src/sandbox/go_build.rs.\nmodule previewd.local/build\n\ngo 1.21\n",
    );
    for (module, pinned) in replaces {
        text.push_str(&format!("\nreplace {module} => {module} {pinned}"));
    }
    text.push('\n');
    text
}

/// A go command and the version it reported.
pub struct Go {
    pub program: PathBuf,
    pub version: String,
}

/// Settings of the caller's that could turn off the checksum database or build for another
/// machine; removed from every go command previewd runs.
const UNSAFE_GO_SETTINGS: [&str; 9] = [
    "GONOSUMDB",
    "GONOSUMCHECK",
    "GONOSUMVERIFY",
    "GOPRIVATE",
    "GOINSECURE",
    "GOOS",
    "GOARCH",
    "GOAMD64",
    "GOEXPERIMENT",
];

impl Go {
    /// A go command in `work` that verifies every module against the checksum database and
    /// builds for this machine, whatever the caller's environment and `go env -w` file say
    /// (`GOENV=off`); the module proxy (`GOPROXY`) stays the caller's, a company mirror say.
    pub fn command(&self, work: &Path) -> Command {
        let mut command = Command::new(&self.program);
        for name in UNSAFE_GO_SETTINGS {
            command.env_remove(name);
        }
        command
            .current_dir(work)
            .env("GOENV", "off")
            .env("GOSUMDB", "sum.golang.org")
            .env("GOFLAGS", "-mod=mod")
            // Go's own go.env says `local`; a Go older than a module's `go` line fetches the
            // toolchain it asks for from the module proxy.
            .env("GOTOOLCHAIN", "auto")
            .env("CGO_ENABLED", "0")
            // The throwaway module is the only one: no workspace of the caller's applies.
            .env("GOWORK", "off");
        command
    }
}

/// The newest go command among `go` on PATH and Go's usual install folders; at least Go 1.21,
/// which fetches the toolchain a module asks for by itself.
pub fn find_go() -> Result<Go, SandboxError> {
    let candidates = [
        which("go"),
        Some(PathBuf::from("/usr/local/go/bin/go")),
        Some(PathBuf::from("/usr/lib/go/bin/go")),
    ];
    let mut found: Vec<(u32, Go)> = candidates
        .into_iter()
        .flatten()
        .filter(|p| is_executable(p))
        .filter_map(|program| {
            // From a neutral folder and with this Go's own toolchain: a go.mod around the
            // caller would otherwise switch toolchains before answering.
            let output = Command::new(&program)
                .args(["env", "GOVERSION"])
                .env("GOTOOLCHAIN", "local")
                .current_dir(std::env::temp_dir())
                .output()
                .ok()?;
            let version = String::from_utf8_lossy(&output.stdout).trim().to_string();
            let minor = go_minor(&version)?;
            Some((minor, Go { program, version }))
        })
        .collect();
    found.sort_by_key(|(minor, _)| std::cmp::Reverse(*minor));
    match found.into_iter().next() {
        Some((minor, go)) if minor >= OLDEST_GO_MINOR => Ok(go),
        Some((_, old)) => Err(SandboxError::Provision(format!(
            "{} is {}: building the control plane needs Go 1.{OLDEST_GO_MINOR} or newer (Go 1.26 is what it is tested with); install a newer Go and put it on PATH",
            old.program.display(),
            old.version
        ))),
        None => Err(SandboxError::Provision(
            "no `go` command found (on PATH, /usr/local/go/bin or /usr/lib/go/bin): the sandbox builds Kubernetes, etcd and Helm from their Go modules once, which needs Go 1.26 (or 1.21 or newer, which fetches 1.26 itself); install Go and try again".into(),
        )),
    }
}

/// `go1.26.8` → 26.
fn go_minor(version: &str) -> Option<u32> {
    let rest = version.strip_prefix("go1.")?;
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// Runs a go command, its output into `log_path`; with `-v`, every compiled package is one line
/// on standard error, counted for the progress line every 15 s.
fn run_go(
    command: &mut Command,
    log_path: &Path,
    what: &str,
    progress: &dyn Progress,
) -> Result<(), SandboxError> {
    let mut log = fs::File::create(log_path).map_err(|e| SandboxError::io(log_path, e))?;
    let mut child = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| SandboxError::Build(format!("cannot run {what}: {e}")))?;
    let started = Instant::now();
    let mut lines = 0usize;
    let mut last_report = Instant::now();
    if let Some(stderr) = child.stderr.take() {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = writeln!(log, "{line}");
            lines += 1;
            if last_report.elapsed() >= Duration::from_secs(15) {
                progress.step(&format!(
                    "  … {what}: {lines} packages, {}s",
                    started.elapsed().as_secs()
                ));
                last_report = Instant::now();
            }
        }
    }
    let status = child
        .wait()
        .map_err(|e| SandboxError::Build(format!("{what}: {e}")))?;
    if status.success() {
        return Ok(());
    }
    let text = fs::read_to_string(log_path).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(25).collect();
    Err(SandboxError::Build(format!(
        "{what} failed ({status}); full log in {}; last lines:\n{}",
        log_path.display(),
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_versions_are_read_by_their_minor() {
        assert_eq!(go_minor("go1.26.8"), Some(26));
        assert_eq!(go_minor("go1.21rc2"), Some(21));
        assert_eq!(go_minor("devel +abc"), None);
    }

    #[test]
    fn the_throwaway_module_pins_what_it_is_told() {
        let go_mod = go_mod(&[("example.com/a".into(), "v0.1.0".into())]);
        assert!(go_mod.contains("module previewd.local/build"), "{go_mod}");
        assert!(
            go_mod.contains("replace example.com/a => example.com/a v0.1.0"),
            "{go_mod}"
        );
    }

    /// A fresh build that does not report what it must is refused, never cached: here `sh`
    /// stands in for a binary of the wrong version.
    #[test]
    fn a_build_that_does_not_report_its_version_is_refused() {
        let folder = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/bin/sh", folder.path().join("tool")).unwrap();
        let check = |expected: &str| {
            GoBuild {
                name: "tool".into(),
                what: "tool".into(),
                packages: Vec::new(),
                replaces: no_replaces(),
                stamps: Vec::new(),
                binaries: vec!["tool".into()],
                renames: Vec::new(),
                estimate: "seconds",
                checks: vec![(
                    "tool".into(),
                    vec!["-c".into(), "echo tool v1.2.3".into()],
                    expected.into(),
                )],
            }
            .check(folder.path())
        };
        assert!(check("tool v1.2.3").is_ok());
        let refused = check("tool v1.2.4").unwrap_err().to_string();
        assert!(refused.contains("nothing was cached"), "{refused}");
    }
}
