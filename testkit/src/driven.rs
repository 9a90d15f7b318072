//! A service driven line by line: a few lines of Python, or a test program, that takes one
//! command a line on stdin and answers each with one line on stdout.

/// A process driven by one command a line on stdin, each answered with one line on stdout once
/// done; it writes `ready` first. Dropped: its stdin is closed (it ends its loop and cleans up)
/// and it is waited for.
pub struct Driven {
    child: std::process::Child,
    input: Option<std::process::ChildStdin>,
    output: std::io::BufReader<std::process::ChildStdout>,
}

impl Driven {
    /// `python3 -c SCRIPT`.
    pub fn python(script: &str) -> Driven {
        let mut c = std::process::Command::new("python3");
        c.args(["-c", script]);
        Driven::spawn(c)
    }

    /// A test program (see `common::programs::build`) with its arguments.
    pub fn program(path: &std::path::Path, args: &[&str]) -> Driven {
        let mut c = std::process::Command::new(path);
        c.args(args);
        Driven::spawn(c)
    }

    fn spawn(mut command: std::process::Command) -> Driven {
        use std::io::BufRead;
        let mut child = command
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {command:?}: {e}"));
        let input = child.stdin.take();
        let mut output = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        output.read_line(&mut line).unwrap();
        assert_eq!(line, "ready\n");
        Driven {
            child,
            input,
            output,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends command `c` and returns the script's answer (without its newline).
    pub fn step(&mut self, c: &str) -> String {
        use std::io::{BufRead, Write};
        writeln!(self.input.as_mut().unwrap(), "{c}").unwrap();
        let mut line = String::new();
        self.output.read_line(&mut line).unwrap();
        match line.strip_suffix('\n') {
            Some(answer) => answer.to_string(),
            None => panic!("the script's answer to {c} is not a line: {line:?}"),
        }
    }
}

impl Drop for Driven {
    fn drop(&mut self) {
        drop(self.input.take());
        let _ = self.child.wait();
    }
}
