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

use crate::wire::{Reply, Request, read_frame};
use crate::{CompileError, Event, Transform};

/// The address space a runner allows itself: room for the compiler's thread (its stack is
/// reserved, not used), the programs it keeps and one run's values, and far less than a
/// service's machine.
pub const MEMORY_LIMIT_BYTES: u64 = 1 << 30;

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

/// Answers requests read from `input` on `output` until `input` ends. Each reply is flushed
/// before the next request runs: if that one crashes the runner, every earlier reply has
/// reached the pool, which then knows whose program it was.
pub fn serve(mut input: BufReader<impl Read>, mut output: impl Write) -> io::Result<()> {
    let mut programs: HashMap<String, Result<Arc<Transform>, CompileError>> = HashMap::new();
    while let Some(frame) = read_frame(&mut input)? {
        let request = Request::decode(&frame)?;
        if !programs.contains_key(&request.source) && programs.len() >= KEPT_PROGRAMS {
            programs.clear();
        }
        let program = programs
            .entry(request.source.clone())
            .or_insert_with(|| Transform::compile(&request.source).map(Arc::new));
        let reply = match program {
            Err(e) => Reply::Compile(e.clone()),
            Ok(transform) => {
                let event = Event {
                    id: &request.id,
                    topic: &request.topic,
                    data: &request.data,
                    tenant_id: &request.tenant_id,
                };
                match transform.run(&event, &request.limits) {
                    Ok(output) => Reply::Ran(output),
                    Err(e) => Reply::Failed(e.to_string()),
                }
            }
        };
        output.write_all(&reply.encode())?;
        output.flush()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Limits, Output};

    fn request(source: &str) -> Vec<u8> {
        Request {
            source: source.to_owned(),
            id: "evt_1".to_owned(),
            topic: "order.paid".to_owned(),
            data: br#"{"total": 250}"#.to_vec(),
            tenant_id: "acme".to_owned(),
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
