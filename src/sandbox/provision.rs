//! Provisioning: a real kube-apiserver, kube-controller-manager and kube-scheduler, built once
//! from Debian's `kubernetes` source package and cached, plus the Debian packages the sandbox
//! runs on (etcd, Go, openssl).
//!
//! Why build from source: the machines previewd is developed and tested on have no Docker
//! engine and reach no network but the package registries, and Debian ships the Kubernetes
//! server only as source (1.20.2 in bookworm, every Go dependency vendored). It builds offline
//! with Debian's Go in about 8 minutes on 2 cores.
//!
//! The one patch: the vendored `github.com/modern-go/reflect2` v1.0.1 is unsafe under Go 1.18
//! and later; an apiserver built with it dies with SIGSEGV in
//! `reflect2.(*UnsafeMapType).UnsafeIterate` while encoding responses (pretty-printed ones
//! first). We swap in Debian's reflect2 1.0.2 before building.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::SandboxError;

/// Bumped whenever the build recipe changes, so old caches are not reused.
const RECIPE: &str = "k8s-1.20.2+reflect2-1.0.2-r1";
/// The Debian release whose source package we build (1.20.2).
const SOURCE_SUITE: &str = "bookworm";
const REFLECT2_DIR: &str = "/usr/share/gocode/src/github.com/modern-go/reflect2";
/// The three binaries built from source.
pub const SERVER_BINARIES: [&str; 3] = [
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
];
/// Debian packages the sandbox needs at build and run time, with a binary that proves each.
const PACKAGES: [(&str, &str); 6] = [
    ("etcd-server", "/usr/bin/etcd"),
    ("golang-go", "/usr/bin/go"),
    ("golang-github-modern-go-reflect2-dev", REFLECT2_DIR),
    ("build-essential", "/usr/bin/make"),
    ("rsync", "/usr/bin/rsync"),
    ("openssl", "/usr/bin/openssl"),
];

/// Where the control-plane binaries are.
#[derive(Clone, Debug)]
pub struct Binaries {
    pub dir: PathBuf,
    pub etcd: PathBuf,
}

impl Binaries {
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// Reports progress of a long provisioning step to a person.
pub trait Progress: Send + Sync {
    fn step(&self, message: &str);
}

/// Progress printed to stderr with a `[sandbox]` prefix.
pub struct StderrProgress;

impl Progress for StderrProgress {
    fn step(&self, message: &str) {
        eprintln!("[sandbox] {message}");
    }
}

/// The cached binaries, building them first if needed. Safe to call from several processes at
/// once: the build runs under a file lock and the others wait for it.
pub fn ensure_binaries(
    cache_dir: &Path,
    progress: &dyn Progress,
) -> Result<Binaries, SandboxError> {
    let target = cache_dir.join("control-plane").join(RECIPE);
    if let Some(binaries) = cached(&target) {
        return Ok(binaries);
    }
    ensure_packages(progress)?;
    fs::create_dir_all(cache_dir.join("control-plane"))
        .map_err(|e| SandboxError::io(cache_dir, e))?;
    let _lock = FileLock::acquire(
        &cache_dir.join("control-plane").join(".build.lock"),
        progress,
        "building the control plane",
    )?;
    if let Some(binaries) = cached(&target) {
        return Ok(binaries); // another process built them while we waited
    }
    build(cache_dir, &target, progress)?;
    cached(&target).ok_or_else(|| {
        SandboxError::Build(format!(
            "{} is incomplete after the build",
            target.display()
        ))
    })
}

fn cached(target: &Path) -> Option<Binaries> {
    let complete = SERVER_BINARIES
        .iter()
        .all(|name| is_executable(&target.join(name)));
    let etcd = which("etcd")?;
    complete.then(|| Binaries {
        dir: target.to_path_buf(),
        etcd,
    })
}

pub(super) fn is_executable(path: &Path) -> bool {
    fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Looks a program up on PATH and in the usual system directories.
pub fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/bin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
}

/// Installs the Debian packages that are missing. Needs root; says so plainly otherwise.
pub fn ensure_packages(progress: &dyn Progress) -> Result<(), SandboxError> {
    let missing: Vec<&str> = PACKAGES
        .iter()
        .filter(|(_, proof)| !Path::new(proof).exists())
        .map(|(package, _)| *package)
        .collect();
    ensure_debian_packages(&missing, progress)
}

/// Installs Debian `packages` (none: nothing to do). Needs root; says so plainly otherwise.
pub fn ensure_debian_packages(
    missing: &[&str],
    progress: &dyn Progress,
) -> Result<(), SandboxError> {
    if missing.is_empty() {
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(SandboxError::Provision(format!(
            "the sandbox needs these Debian packages, and installing them needs root: \
             run `sudo apt-get install -y {}` and try again",
            missing.join(" ")
        )));
    }
    progress.step(&format!(
        "installing Debian packages: {}",
        missing.join(" ")
    ));
    run_logged(
        Command::new("apt-get").args(["update", "-qq"]),
        "apt-get update",
    )?;
    run_logged(
        Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(missing),
        "apt-get install",
    )
}

fn build(cache_dir: &Path, target: &Path, progress: &dyn Progress) -> Result<(), SandboxError> {
    let work = cache_dir.join("control-plane").join("work");
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(work.join("apt/lists/partial")).map_err(|e| SandboxError::io(&work, e))?;

    progress.step("downloading Debian's `kubernetes` source package (1.20.2)");
    download_source(&work)?;
    let tarball = find_entry(&work, |name| {
        name.starts_with("kubernetes_") && name.ends_with(".orig.tar.gz")
    })
    .ok_or_else(|| {
        SandboxError::Provision(format!("no kubernetes_*.orig.tar.gz in {}", work.display()))
    })?;
    run_logged(
        Command::new("tar")
            .arg("-xzf")
            .arg(&tarball)
            .arg("-C")
            .arg(&work),
        "unpack the kubernetes source",
    )?;
    let source = find_entry(&work, |name| name.starts_with("kubernetes-"))
        .filter(|p| p.is_dir())
        .ok_or_else(|| {
            SandboxError::Provision("the source tarball held no kubernetes-* folder".into())
        })?;

    progress.step("replacing the vendored reflect2 1.0.1 with Debian's 1.0.2 (1.0.1 crashes under Go >= 1.18)");
    replace_reflect2(&source.join("vendor/github.com/modern-go/reflect2"))?;

    progress.step("building kube-apiserver, kube-controller-manager and kube-scheduler (about 8 minutes on 2 cores, once)");
    make(&source, &work.join("make.log"), progress)?;

    let staging = cache_dir
        .join("control-plane")
        .join(format!("{RECIPE}.partial"));
    let _ = fs::remove_dir_all(&staging);
    fs::create_dir_all(&staging).map_err(|e| SandboxError::io(&staging, e))?;
    let built = source.join("_output/local/bin/linux/amd64");
    for name in SERVER_BINARIES {
        fs::copy(built.join(name), staging.join(name))
            .map_err(|e| SandboxError::io(&built.join(name), e))?;
    }
    fs::write(
        staging.join("BUILD-INFO"),
        format!("recipe: {RECIPE}\nsource: Debian {SOURCE_SUITE} kubernetes, reflect2 from {REFLECT2_DIR}\n"),
    )
    .map_err(|e| SandboxError::io(&staging, e))?;
    let _ = fs::remove_dir_all(target);
    fs::rename(&staging, target).map_err(|e| SandboxError::io(target, e))?;
    let _ = fs::remove_dir_all(&work);
    progress.step(&format!(
        "control-plane binaries cached in {}",
        target.display()
    ));
    Ok(())
}

/// The machine's own Debian mirror, read from its apt configuration (never a hard-coded host).
pub fn configured_mirror() -> Result<String, SandboxError> {
    let mut candidates = Vec::new();
    if let Ok(entries) = fs::read_dir("/etc/apt/sources.list.d") {
        let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        paths.sort();
        for path in paths
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "sources"))
        {
            candidates.extend(mirrors_in_deb822(
                &fs::read_to_string(path).unwrap_or_default(),
            ));
        }
    }
    candidates.extend(mirrors_in_one_line_format(
        &fs::read_to_string("/etc/apt/sources.list").unwrap_or_default(),
    ));
    candidates.into_iter().next().ok_or_else(|| {
        SandboxError::Provision(
            "found no Debian mirror in /etc/apt/sources.list.d/*.sources or /etc/apt/sources.list"
                .into(),
        )
    })
}

/// Mirror URIs of deb822 stanzas that serve the main archive (not the security archive).
fn mirrors_in_deb822(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for stanza in text.split("\n\n") {
        let field = |name: &str| {
            stanza
                .lines()
                .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
                .unwrap_or_default()
        };
        let suites = field("Suites:");
        if suites.split_whitespace().any(|s| !s.ends_with("-security")) {
            found.extend(field("URIs:").split_whitespace().map(str::to_string));
        }
    }
    found
}

fn mirrors_in_one_line_format(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace().filter(|w| !w.starts_with('['));
            (words.next() == Some("deb")).then_some(())?;
            let uri = words.next()?;
            let suite = words.next()?;
            (!suite.ends_with("-security")).then(|| uri.to_string())
        })
        .collect()
}

/// `apt-get source --download-only kubernetes` through a private source list, leaving the
/// system's apt configuration untouched.
fn download_source(work: &Path) -> Result<(), SandboxError> {
    let mirror = configured_mirror()?;
    let list = work.join("apt/src.list");
    fs::write(
        &list,
        format!("deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {mirror} {SOURCE_SUITE} main\n"),
    )
    .map_err(|e| SandboxError::io(&list, e))?;
    let private = [
        format!("Dir::Etc::sourcelist={}", list.display()),
        "Dir::Etc::sourceparts=-".to_string(),
        format!("Dir::State::Lists={}", work.join("apt/lists").display()),
    ];
    let apt = |args: &[&str]| {
        let mut command = Command::new("apt-get");
        for option in &private {
            command.arg("-o").arg(option);
        }
        command.args(args).current_dir(work);
        command
    };
    run_logged(
        &mut apt(&["update", "-qq"]),
        "apt-get update (private deb-src list)",
    )?;
    run_logged(
        &mut apt(&["source", "--download-only", "kubernetes"]),
        "apt-get source kubernetes",
    )
}

fn replace_reflect2(vendored: &Path) -> Result<(), SandboxError> {
    let is_code = |p: &Path| p.extension().is_some_and(|e| e == "go" || e == "s");
    for entry in fs::read_dir(vendored)
        .map_err(|e| SandboxError::io(vendored, e))?
        .flatten()
    {
        if is_code(&entry.path()) {
            fs::remove_file(entry.path()).map_err(|e| SandboxError::io(&entry.path(), e))?;
        }
    }
    let mut copied = 0;
    for entry in fs::read_dir(REFLECT2_DIR)
        .map_err(|e| SandboxError::io(Path::new(REFLECT2_DIR), e))?
        .flatten()
    {
        if is_code(&entry.path()) {
            fs::copy(entry.path(), vendored.join(entry.file_name()))
                .map_err(|e| SandboxError::io(&entry.path(), e))?;
            copied += 1;
        }
    }
    if copied == 0 {
        return Err(SandboxError::Provision(format!(
            "{REFLECT2_DIR} holds no .go files"
        )));
    }
    Ok(())
}

/// Runs the Kubernetes make with `GOFLAGS=-v`, so every compiled Go package is one log line,
/// and reports the count every 15 s.
fn make(source: &Path, log_path: &Path, progress: &dyn Progress) -> Result<(), SandboxError> {
    let log = fs::File::create(log_path).map_err(|e| SandboxError::io(log_path, e))?;
    let mut child = Command::new("make")
        .arg(format!(
            "WHAT={}",
            SERVER_BINARIES.map(|b| format!("cmd/{b}")).join(" ")
        ))
        .env("GOFLAGS", "-v")
        .current_dir(source)
        .stdout(log.try_clone().map_err(|e| SandboxError::io(log_path, e))?)
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| SandboxError::Build(format!("cannot run make: {e}")))?;
    let stderr = child.stderr.take().expect("piped stderr");
    let started = Instant::now();
    let mut log = log;
    let mut packages = 0usize;
    let mut last_report = Instant::now();
    for line in BufReader::new(stderr).lines().map_while(Result::ok) {
        let _ = writeln!(log, "{line}");
        if !line.starts_with('+') && !line.contains(' ') {
            packages += 1; // `go build -v` prints bare package paths
        }
        if last_report.elapsed() >= Duration::from_secs(15) {
            progress.step(&format!(
                "  … {packages} Go packages compiled, {}s",
                started.elapsed().as_secs()
            ));
            last_report = Instant::now();
        }
    }
    let status = child
        .wait()
        .map_err(|e| SandboxError::Build(format!("make: {e}")))?;
    if !status.success() {
        let text = fs::read_to_string(log_path).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(25).collect();
        return Err(SandboxError::Build(format!(
            "make failed ({status}); full log in {}; last lines:\n{}",
            log_path.display(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        )));
    }
    progress.step(&format!(
        "built in {}s ({packages} Go packages)",
        started.elapsed().as_secs()
    ));
    Ok(())
}

fn find_entry(dir: &Path, matches: impl Fn(&str) -> bool) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter(|e| matches(&e.file_name().to_string_lossy()))
        .map(|e| e.path())
        .collect();
    found.sort();
    found.into_iter().next()
}

pub(super) fn run_logged(command: &mut Command, what: &str) -> Result<(), SandboxError> {
    let output = command
        .output()
        .map_err(|e| SandboxError::Provision(format!("{what}: cannot run: {e}")))?;
    if output.status.success() {
        return Ok(());
    }
    Err(SandboxError::Provision(format!(
        "{what} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )))
}

/// An exclusive `flock` on a file, released on drop.
pub(super) struct FileLock(fs::File);

impl FileLock {
    /// Waits for the lock on `path`; says so when another process holds it (doing `what`).
    pub(super) fn acquire(
        path: &Path,
        progress: &dyn Progress,
        what: &str,
    ) -> Result<Self, SandboxError> {
        use std::os::fd::AsRawFd;
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(|e| SandboxError::io(path, e))?;
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            progress.step(&format!("another process is {what}; waiting for it"));
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
                return Err(SandboxError::io(path, std::io::Error::last_os_error()));
            }
        }
        Ok(Self(file))
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        // SAFETY: unlocking a descriptor we own.
        unsafe {
            libc::flock(self.0.as_raw_fd(), libc::LOCK_UN);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirror_comes_from_the_main_archive_stanza_not_security() {
        let text = "Types: deb\nURIs: http://security.example/debian-security\nSuites: bookworm-security\nComponents: main\n\n\
                    Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n";
        assert_eq!(mirrors_in_deb822(text), ["http://mirror.example/debian"]);
    }

    #[test]
    fn mirror_from_one_line_sources_list() {
        let text = "# comment\ndeb [arch=amd64] http://m.example/debian bookworm main\ndeb http://s.example/debian-security bookworm-security main\n";
        assert_eq!(
            mirrors_in_one_line_format(text),
            ["http://m.example/debian"]
        );
    }
}
