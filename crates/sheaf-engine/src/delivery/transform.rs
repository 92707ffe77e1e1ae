//! A destination's transformation, applied to one delivery before it is sent: the program runs
//! in a runner process (`sheaf_transform::pool`) on the event as published, and its result is
//! what the destination type sends and signs.
//!
//! A program's own failure (an error, a limit, a crash, a runaway) fails the attempt for good:
//! the same program on the same event fails the same way, so the delivery is dead-lettered at
//! once, with the message in the attempt record. A runner that cannot be started is a fault of
//! the deployment, not of the event: that attempt is retried on schedule.

use std::collections::BTreeMap;
use std::time::Instant;

use sheaf_destination::Report;
use sheaf_store::{Destination, Job};
use sheaf_transform::{Event, Limits, Output};

use crate::state::Core;

/// What a destination's transformation made of a delivery.
pub(super) enum Shaped {
    /// Send this body with these headers (the destination's own, then the program's).
    Send {
        body: Vec<u8>,
        headers: BTreeMap<String, String>,
    },
    /// The program dropped the event: nothing is sent, and the attempt is recorded as filtered.
    Filtered { elapsed: std::time::Duration },
    /// Nothing can be sent: this is the attempt's report.
    Failed(Report),
}

/// Runs `source`, the destination's program, on the event (`body` is its `data`, serialized).
/// `reserved` are the header names the destination's type sets itself.
pub(super) async fn shape(
    core: &Core,
    source: &str,
    destination: &Destination,
    reserved: &[&str],
    job: &Job,
    topic: &str,
    body: &[u8],
) -> Shaped {
    let started = Instant::now();
    let event = Event {
        id: job.event_id.as_str(),
        topic,
        data: body,
        tenant_id: job.tenant_id.as_str(),
    };
    let limits = Limits {
        max_body_bytes: core.config.transforms.max_body_bytes,
        ..Limits::default()
    };
    let output = core.transforms.run(source, &event, &limits).await;
    let elapsed = started.elapsed();
    match output {
        Ok(Output::Drop) => Shaped::Filtered { elapsed },
        Ok(Output::Send { body, headers }) => match with_headers(destination, reserved, headers) {
            Ok(headers) => Shaped::Send { body, headers },
            Err(message) => Shaped::Failed(Report::permanent(message, elapsed)),
        },
        Err(failure) if failure.permanent => {
            Shaped::Failed(Report::permanent(failure.message, elapsed))
        }
        Err(failure) => Shaped::Failed(Report::retry(failure.message, elapsed)),
    }
}

/// The destination's headers with the program's over them. A name the destination's type sets
/// itself, or a name or value HTTP cannot carry, fails the attempt (the API checks a
/// destination's own headers the same way when it is saved).
fn with_headers(
    destination: &Destination,
    reserved: &[&str],
    added: Vec<(String, String)>,
) -> Result<BTreeMap<String, String>, String> {
    let mut headers = destination.headers.clone();
    for (name, value) in added {
        let lower = name.to_ascii_lowercase();
        if reserved.contains(&lower.as_str()) {
            return Err(format!(
                "the transformation set the header {name:?}, which the destination sets itself"
            ));
        }
        if http::HeaderName::from_bytes(lower.as_bytes()).is_err()
            || http::HeaderValue::from_str(&value).is_err()
        {
            return Err(format!(
                "the transformation set the header {name:?} to a name or value HTTP cannot carry"
            ));
        }
        headers.retain(|own, _| !own.eq_ignore_ascii_case(&name));
        headers.insert(name, value);
    }
    Ok(headers)
}
