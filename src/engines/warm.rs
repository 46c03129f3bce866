//! A child process kept running between requests: it reads one request at a time on its
//! standard input and answers on its standard output, each message a little-endian `u32`
//! length and that many bytes (`previewd render-worker`). Starting a process and touching fresh
//! memory cost more than a small render itself; a warm child costs neither.
//!
//! Its memory limit holds for its whole life (`RLIMIT_DATA`) and its resident memory is
//! watched while it works ([`process::watch_memory`]), so one request that builds too much
//! stops the child, and that request is the only one it was serving: the failure is said of
//! the right input. A child is dropped (killed) after any failure, and retired by its owner
//! once its memory has grown ([`WarmChild::resident`]).

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::task::JoinHandle;

use super::process::{self, Run, RunError};

/// How long a stopped child is given to say why (its exit status, the rest of its standard
/// error).
const LAST_WORDS: Duration = Duration::from_secs(1);

/// A child waiting for its next request.
pub struct WarmChild {
    child: Child,
    program: String,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// The beginning of its standard error, read until it exits.
    stderr: Option<JoinHandle<Vec<u8>>>,
    /// How many requests it answered.
    pub served: u32,
}

/// What one request may take.
pub struct Limits {
    pub timeout: Duration,
    pub max_answer: usize,
    pub max_memory: u64,
}

/// How an exchange ended, before the child is asked why it stopped.
enum Ended {
    Answered(Vec<u8>),
    TooLong,
    Stopped,
    TimedOut,
    OverMemory,
}

impl WarmChild {
    /// Starts `run`'s program (which must read its standard input) under its memory limit.
    pub fn start(run: Run<'_>) -> Result<Self, RunError> {
        let program = run.program.display().to_string();
        let mut child = process::start(run)?.into_child();
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(RunError::NotStarted {
                program,
                reason: "no pipes".into(),
            });
        };
        Ok(Self {
            child,
            program,
            stdin,
            stdout: BufReader::new(stdout),
            stderr: Some(tokio::spawn(process::read_start(stderr, 8 << 10))),
            served: 0,
        })
    }

    /// Sends `input` and returns the answer, within `limits`. After an error the child is of
    /// no further use: drop it (which kills it).
    pub async fn exchange(&mut self, input: &[u8], limits: &Limits) -> Result<Vec<u8>, RunError> {
        let over_memory = process::watch_memory(self.child.id(), limits.max_memory);
        let talk = tokio::time::timeout(limits.timeout, self.talk(input, limits.max_answer));
        let ended = tokio::select! {
            talked = talk => talked.unwrap_or(Ended::TimedOut),
            () = over_memory => Ended::OverMemory,
        };
        let program = self.program.clone();
        match ended {
            Ended::Answered(answer) => {
                self.served = self.served.saturating_add(1);
                Ok(answer)
            }
            Ended::TooLong => Err(RunError::TooMuchOutput {
                program,
                limit: limits.max_answer,
            }),
            Ended::TimedOut => Err(RunError::TimedOut {
                program,
                limit: limits.timeout,
            }),
            Ended::OverMemory => Err(RunError::OutOfMemory {
                program,
                limit: limits.max_memory,
            }),
            Ended::Stopped => Err(self.why_it_stopped(limits.max_memory).await),
        }
    }

    async fn talk(&mut self, input: &[u8], max_answer: usize) -> Ended {
        let Ok(length) = u32::try_from(input.len()) else {
            return Ended::TooLong;
        };
        let sent = async {
            self.stdin.write_all(&length.to_le_bytes()).await?;
            self.stdin.write_all(input).await?;
            self.stdin.flush().await
        };
        if sent.await.is_err() {
            return Ended::Stopped;
        }
        let mut header = [0u8; 4];
        if self.stdout.read_exact(&mut header).await.is_err() {
            return Ended::Stopped;
        }
        let length = usize::try_from(u32::from_le_bytes(header)).unwrap_or(usize::MAX);
        if length > max_answer {
            return Ended::TooLong;
        }
        let mut answer = vec![0; length];
        match self.stdout.read_exact(&mut answer).await {
            Ok(_) => Ended::Answered(answer),
            Err(_) => Ended::Stopped,
        }
    }

    /// What a child that stopped answering said (its standard error) and how it exited.
    async fn why_it_stopped(&mut self, max_memory: u64) -> RunError {
        let status = tokio::time::timeout(LAST_WORDS, self.child.wait()).await;
        let said = match self.stderr.take() {
            Some(reading) => tokio::time::timeout(LAST_WORDS, reading)
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default(),
            None => Vec::new(),
        };
        if process::ran_out_of_memory(&said) {
            return RunError::OutOfMemory {
                program: self.program.clone(),
                limit: max_memory,
            };
        }
        let status = status.ok().and_then(Result::ok);
        RunError::Failed {
            message: process::message_of(&said, status),
        }
    }

    /// Its resident memory now, in bytes; `None` once it has exited.
    pub async fn resident(&self) -> Option<u64> {
        process::resident_bytes(self.child.id()?).await
    }
}
