//! The runner: the process a service runs transformations in (see [`crate::pool`]).
//!
//! It reads requests on its standard input and writes one reply per request on its standard
//! output, one at a time, compiling each program the first time it sees it. It holds nothing a
//! program could misuse: it is started with an empty environment, reads nothing but its
//! requests, and limits its own address space, so a program that builds a huge value fails
//! the allocation (and the runner) instead of growing into the service's machine. A program that
//! overflows the stack or loops kills or stalls only this process; the service notices, stops
//! it and starts another.

use std::collections::HashMap;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::wire::{Reply, Request, read_frame};
use crate::{CompileError, Transform};

/// The address space a runner allows itself: room for the compiler's thread (its stack is
/// reserved, not used), the programs it keeps and one run's values, and far less than a
/// service's machine.
pub const MEMORY_LIMIT_BYTES: u64 = 1 << 30;

/// The longest a written reply stays in the runner's buffer while it runs further requests.
const FLUSH_AFTER: Duration = Duration::from_millis(20);

/// How many compiled programs a runner keeps; past it, it starts afresh.
const KEPT_PROGRAMS: usize = 256;

/// Runs as a runner on this process's standard input and output until the input ends: what a
/// binary's `main` calls (Sheaf's `sheaf transform-runner`, or `sheaf-transform-runner`).
/// Limits the process's address space to [`MEMORY_LIMIT_BYTES`] first.
pub fn serve_stdio() -> io::Result<()> {
    rlimit::setrlimit(rlimit::Resource::AS, MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES)?;
    let stdin = io::stdin().lock();
    let stdout = io::stdout().lock();
    serve(BufReader::new(stdin), BufWriter::new(stdout))
}

/// Answers requests read from `input` on `output` until `input` ends. Replies are flushed
/// whenever no further request is buffered, so a batch costs a few writes; if a request
/// crashes the runner with replies unwritten, the pool runs the unanswered ones again alone
/// and so learns whose program it was.
pub fn serve(mut input: BufReader<impl Read>, mut output: impl Write) -> io::Result<()> {
    let mut programs: HashMap<String, Result<Arc<Transform>, CompileError>> = HashMap::new();
    let mut flushed = Instant::now();
    while let Some(frame) = read_frame(&mut input)? {
        let request = Request::decode(&frame)?;
        if !programs.contains_key(request.source) {
            if programs.len() >= KEPT_PROGRAMS {
                programs.clear();
            }
            let compiled = Transform::compile(request.source).map(Arc::new);
            programs.insert(request.source.to_owned(), compiled);
        }
        let reply = match &programs[request.source] {
            Err(e) => Reply::Compile(e.clone()),
            Ok(transform) => match transform.run(&request.event, &request.limits) {
                Ok(output) => Reply::Ran(output),
                Err(e) => Reply::Failed(e.to_string()),
            },
        };
        output.write_all(&reply.encode())?;
        // Out once no request waits in what was read, or some time after the last write: a
        // batch's replies go in a few writes, not one per request (a crash loses the unwritten
        // ones; the pool then reruns them one at a time, and finds the culprit), and no reply
        // waits long behind slow runs for the pool's runaway clock.
        if input.buffer().is_empty() || flushed.elapsed() >= FLUSH_AFTER {
            output.flush()?;
            flushed = Instant::now();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Limits, Output};

    fn request(source: &str) -> Vec<u8> {
        Request {
            source,
            event: crate::Event {
                id: "evt_1",
                topic: "order.paid",
                data: br#"{"total": 250}"#,
                tenant_id: "acme",
            },
            limits: Limits::default(),
        }
        .encode()
    }

    #[test]
    fn a_runner_answers_each_request_in_turn() {
        let mut input = Vec::new();
        for source in [".data.total", "empty", "{", "error(\"no\")", ".data.total"] {
            input.extend(request(source));
        }
        let mut output = Vec::new();
        serve(BufReader::new(&input[..]), &mut output).unwrap();
        let mut replies = &output[..];
        let mut next = || Reply::decode(&read_frame(&mut replies).unwrap().unwrap()).unwrap();
        let sent = |body: &[u8]| {
            Reply::Ran(Output::Send {
                body: body.to_vec(),
                headers: vec![],
            })
        };
        assert_eq!(next(), sent(b"250"));
        assert_eq!(next(), Reply::Ran(Output::Drop));
        assert!(
            matches!(next(), Reply::Compile(e) if e.line == 1),
            "a syntax error"
        );
        assert_eq!(
            next(),
            Reply::Failed("the transformation failed: no".to_owned())
        );
        assert_eq!(next(), sent(b"250"), "the kept program runs again");
        assert!(read_frame(&mut replies).unwrap().is_none());
    }

    #[test]
    fn a_runner_stops_at_input_that_is_not_a_request() {
        let mut input = request(".");
        input.extend([3, 0, 0, 0, 1, 2, 3]);
        let mut output = Vec::new();
        assert!(serve(BufReader::new(&input[..]), &mut output).is_err());
        assert!(!output.is_empty(), "the request before it was answered");
    }
}
