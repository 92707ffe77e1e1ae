//! `cargo xtask …`: the one entry point for setting up, testing and checking Sheaf.
//!
//! The commands start real servers (Postgres 15 from Debian packages, ClickHouse
//! 26.9 from the `chdb-core` wheel), hand their URLs to the test suites through
//! `SHEAF_TEST_*` variables, and stop exactly what they started. Everything
//! here must work on a fresh machine with nothing installed by hand.

mod bench;
mod chaos;
mod codegen;
mod package;
mod process;
mod services;
mod test;

use std::process::ExitCode;

const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  services up        start Postgres (wal_level = logical, TLS on), a Postgres with TLS off, ClickHouse and
                     its HTTPS front (test certificates in ~/.cache/sheaf/tls), a RabbitMQ node and a
                     NATS server with JetStream; write target/xtask/services.env
  services up --cluster
                     the same, a ClickHouse cluster of 2 shards x 2 replicas and a 3-node NATS JetStream
                     cluster (the `test` command starts them too)
  services down      stop what `services up` started, by PID
  services status    show what is running and whether xtask started it
  test [ARGS…]       services up --cluster, every test of the workspace (doctests counted), `package`, `bench all --quick`,
                     services down (ARGS go to the test runner)
  bench SCENARIO…|all [--quick]
                     services up, the mechanisms' experiments on the real servers (lookup, parts, queue, delivery,
                     burst, cdc, destinations, memory), services down; results in target/bench/<scenario>.json and .svg
  chaos SCENARIO…|all [--quick]
                     the fault suite on servers of its own (Postgres 15/sheaf_chaos, ClickHouse in
                     target/xtask/chaos-clickhouse, and a 2x2 ClickHouse cluster in
                     target/xtask/chaos-clickhouse-cluster for clickhouse-replica alone; a 3-node NATS
                     cluster in target/xtask/chaos-nats-cluster, started only by a scenario that asks),
                     started and stopped around it: kill, ordering, postgres, clickhouse, clickhouse-replica,
                     shutdown, cdc, broker, outage, disabled, overload, secrets, sqlite
  chaos-ctl postgres stop|start|restart | clickhouse stop|start
  chaos-ctl clickhouse-cluster up|down|kill NODE|start NODE
  chaos-ctl nats-cluster up|down|kill NODE|start NODE
                     stop or start the fault suite's own servers (its scenarios call this); NODE is
                     shard1-replica1 … shard2-replica2 or n1 … n3, killed with SIGKILL, started with
                     its data
  package [--no-verify]
                     `cargo package` of every publishable crate (publish not false in cargo metadata), offline,
                     in dependency order, each verified by building it from its .crate; then `cargo doc` of
                     them with rustdoc warnings denied
  codegen            rewrite the generated parts of the docs (the settings table in docs/configuration.md,
                     the metrics table in docs/operations.md)
  ci                 cargo fmt --check, cargo clippy -D warnings, then `test`
";

fn main() -> ExitCode {
    match try_main() {
        Ok(code) => code,
        Err(err) => {
            eprintln!("xtask: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn try_main() -> anyhow::Result<ExitCode> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    match words.as_slice() {
        ["services", "up"] => {
            let env = services::up(false)?;
            env.print();
            Ok(ExitCode::SUCCESS)
        }
        ["services", "up", "--cluster"] => {
            let env = services::up(true)?;
            env.print();
            Ok(ExitCode::SUCCESS)
        }
        ["services", "down"] => {
            services::down()?;
            Ok(ExitCode::SUCCESS)
        }
        ["services", "status"] => {
            services::status()?;
            Ok(ExitCode::SUCCESS)
        }
        ["test", rest @ ..] => test::test(rest),
        ["bench", rest @ ..] => bench::bench(rest),
        ["chaos", rest @ ..] => chaos::chaos(rest),
        ["chaos-ctl", rest @ ..] => chaos::ctl(rest),
        ["package", rest @ ..] => package::package(rest),
        ["codegen"] => codegen::codegen(),
        ["ci"] => test::ci(),
        ["help" | "--help" | "-h"] | [] => {
            print!("{USAGE}");
            Ok(ExitCode::SUCCESS)
        }
        _ => {
            eprint!("{USAGE}");
            anyhow::bail!("unknown command `{}`", args.join(" "))
        }
    }
}
