//! The pool against real runner processes (`sheaf-transform-runner`): results, failures, and
//! the programs that must cost a runner and never the caller.

use std::time::{Duration, Instant};

use sheaf_transform::pool::{Failure, Pool, RunnerCommand};
use sheaf_transform::{Event, Limits, Output};

fn pool(size: usize) -> Pool {
    Pool::new(
        RunnerCommand {
            program: env!("CARGO_BIN_EXE_sheaf-transform-runner").into(),
            args: vec![],
        },
        size,
    )
}

const EVENT: Event<'static> = Event {
    id: "evt_1",
    topic: "order.paid",
    data: br#"{"id": "ord_7", "total": 250}"#,
    tenant_id: "acme",
};

async fn run(pool: &Pool, source: &str) -> Result<Output, Failure> {
    pool.run(source, &EVENT, &Limits::default()).await
}

fn body(output: Result<Output, Failure>) -> String {
    match output {
        Ok(Output::Send { body, .. }) => String::from_utf8(body).unwrap(),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn programs_run_in_a_runner_with_their_results_and_failures() {
    let pool = pool(2);
    pool.probe().await.unwrap();
    assert_eq!(
        run(
            &pool,
            r#"{order: .data.id} | with_headers({"x-total": ($event.data.total | tostring)})"#
        )
        .await
        .unwrap(),
        Output::Send {
            body: br#"{"order":"ord_7"}"#.to_vec(),
            headers: vec![("x-total".to_owned(), "250".to_owned())],
        }
    );
    assert_eq!(run(&pool, "empty").await.unwrap(), Output::Drop);
    let failed = run(&pool, r#"error("no card")"#).await.unwrap_err();
    assert!(
        failed.permanent && failed.message.contains("no card"),
        "{failed:?}"
    );
    let broken = run(&pool, "{order: .data.id").await.unwrap_err();
    assert!(broken.message.contains("does not compile"), "{broken:?}");
    // The environment of the service is not the program's to read.
    let env = run(&pool, "env").await.unwrap_err();
    assert!(env.message.contains("undefined"), "{env:?}");
    let env = run(&pool, "$ENV").await.unwrap_err();
    assert!(env.message.contains("undefined"), "{env:?}");
    // Runs side by side in two runners, each answer for its own request.
    let pool = std::sync::Arc::new(pool);
    let mut runs = tokio::task::JoinSet::new();
    for i in 0..64 {
        let pool = std::sync::Arc::clone(&pool);
        runs.spawn(async move { (i, body(run(&pool, &format!(".data.total + {i}")).await)) });
    }
    while let Some(done) = runs.join_next().await {
        let (i, answer) = done.unwrap();
        assert_eq!(answer, (250 + i).to_string());
    }
}

#[tokio::test]
async fn a_runaway_is_stopped_and_refused_and_the_pool_goes_on() {
    let pool = pool(1).runaway_after(Duration::from_millis(300));
    let started = Instant::now();
    let runaway = run(&pool, "def f: f; f").await.unwrap_err();
    assert!(runaway.permanent, "{runaway:?}");
    assert!(runaway.message.contains("ran past"), "{runaway:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let started = Instant::now();
    let again = run(&pool, "def f: f; f").await.unwrap_err();
    assert!(again.message.contains("not run again"), "{again:?}");
    assert!(
        started.elapsed() < Duration::from_millis(100),
        "refused without a run"
    );
    assert_eq!(
        body(run(&pool, ".data.id").await),
        r#""ord_7""#,
        "a fresh runner"
    );
}

#[tokio::test]
async fn a_program_that_crashes_its_runner_is_refused_and_the_pool_goes_on() {
    let pool = pool(1);
    // Unbounded recursion overflows the runner's stack, which aborts it.
    let crashed = run(&pool, "def f: 1 + f; f").await.unwrap_err();
    assert!(
        crashed.permanent && crashed.message.contains("crashed"),
        "{crashed:?}"
    );
    let again = run(&pool, "def f: 1 + f; f").await.unwrap_err();
    assert!(again.message.contains("not run again"), "{again:?}");
    assert_eq!(body(run(&pool, ".topic").await), r#""order.paid""#);
}

#[tokio::test]
async fn a_program_that_exhausts_memory_costs_its_runner_not_the_caller() {
    let pool = pool(1).runaway_after(Duration::from_secs(20));
    let started = Instant::now();
    let huge = run(&pool, "[range(1e10)] | length").await.unwrap_err();
    assert!(
        huge.message.contains("crashed"),
        "{huge:?} after {:?}",
        started.elapsed()
    );
    assert_eq!(body(run(&pool, ".id").await), r#""evt_1""#);
}

#[tokio::test]
async fn a_command_that_is_not_a_runner_is_reported() {
    let missing = Pool::new(
        RunnerCommand {
            program: "/nonexistent/sheaf".into(),
            args: vec![],
        },
        1,
    );
    let error = missing.probe().await.unwrap_err();
    assert!(error.contains("cannot start"), "{error}");
    let cat = Pool::new(
        RunnerCommand {
            program: "cat".into(),
            args: vec![],
        },
        1,
    );
    assert!(cat.probe().await.is_err(), "an echo is not an answer");
}

/// Many requests at once to one runner travel in batches; a runaway and a crash in the middle
/// of them are blamed on their own programs, and every other request still gets its own answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_program_inside_a_batch_is_blamed_alone() {
    let pool = std::sync::Arc::new(pool(1).runaway_after(Duration::from_millis(300)));
    let mut runs = tokio::task::JoinSet::new();
    for i in 0..40 {
        let pool = std::sync::Arc::clone(&pool);
        let source = match i {
            13 => "def f: f; f".to_owned(),
            27 => "def f: 1 + f; f".to_owned(),
            _ => format!(".data.total + {i}"),
        };
        runs.spawn(async move { (i, run(&pool, &source).await) });
    }
    let mut answered = 0;
    while let Some(done) = runs.join_next().await {
        let (i, result) = done.unwrap();
        match i {
            13 => {
                let failure = result.unwrap_err();
                assert!(failure.message.contains("ran past"), "{failure:?}");
            }
            27 => {
                let failure = result.unwrap_err();
                assert!(failure.message.contains("crashed"), "{failure:?}");
            }
            _ => assert_eq!(body(result), (250 + i).to_string(), "request {i}"),
        }
        answered += 1;
    }
    assert_eq!(answered, 40);
}
