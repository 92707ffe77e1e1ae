//! Conformance cases for the storage traits, and the `run_*` functions that run them in order.
//!
//! Each case is a plain `pub async fn` taking the store as a trait object, so a backend can call
//! one case alone while it debugs, and `run_*` for everything. A case panics with a message that
//! names what went wrong; it never returns a result to check.

pub mod entity;
pub mod entity_health;
pub mod entity_limits;
pub mod log;
pub mod outbox;
pub mod outbox_order;
pub mod queue;
pub mod replay;
pub mod replay_pages;
pub mod replay_takeover;

use std::fmt::Debug;

use crate::{EntityStore, ErrorKind, JobQueue, LogStore, ReplayStore, Result};

/// Runs every case of the three suites: the log store's, the entity store's, then the queue's.
/// The queue must be one nobody else uses (see the [isolation rule](super#isolation)).
pub async fn run_all(log: &dyn LogStore, queue: &dyn JobQueue, entities: &dyn EntityStore) {
    run_log_store(log).await;
    run_entity_store(entities).await;
    run_job_queue(queue).await;
}

macro_rules! run_cases {
    ($suite:literal, $store:expr, [$($module:ident :: $case:ident),* $(,)?]) => {{
        $(
            eprintln!(concat!("conformance: ", $suite, "::", stringify!($case)));
            $module::$case($store).await;
        )*
    }};
}

/// Runs every [`LogStore`] case. Cases use their own tenants, so the store may be shared.
pub async fn run_log_store(store: &dyn LogStore) {
    run_cases!(
        "log",
        store,
        [
            log::insert_many_is_idempotent,
            log::get_events_returns_only_stored_keys,
            log::records_round_trip_exactly,
            log::trace_contexts_round_trip,
            log::list_events_orders_newest_first_and_filters,
            log::list_attempts_orders_newest_first_and_filters,
            log::pagination_visits_every_item_once,
            log::pagination_rejects_bad_requests,
            log::pagination_survives_interleaved_inserts,
            log::pagination_survives_concurrent_inserts,
            log::reads_are_tenant_isolated,
            log::latest_attempt_follows_the_rules,
            log::latest_attempt_breaks_time_ties_by_id,
            log::latest_attempts_agrees_with_single_lookups,
            log::count_attempts_buckets_by_time_and_status,
        ]
    );
}

/// Runs every [`JobQueue`] case, one at a time. The queue must be idle and used by nobody else.
pub async fn run_job_queue(queue: &dyn JobQueue) {
    run_cases!(
        "queue",
        queue,
        [
            queue::claim_hands_out_due_jobs_in_order,
            queue::enqueue_is_idempotent_and_validated,
            queue::claim_validates_input,
            queue::concurrent_claimers_never_share_a_job,
            queue::expired_lease_returns_the_job,
            queue::renew_extends_the_lease,
            queue::reschedule_moves_the_job,
            queue::release_makes_jobs_claimable_again,
            queue::lost_leases_change_nothing,
            queue::dead_letters_are_kept_and_listed,
            queue::removed_dead_letters_leave_the_list,
            queue::purge_tenant_removes_its_jobs,
            queue::ordered_jobs_of_a_key_go_one_at_a_time_in_enqueue_order,
            queue::concurrent_claimers_keep_each_key_in_order,
            queue::a_dead_letter_that_holds_its_key_keeps_it_until_requeued_or_removed,
            queue::heartbeats_count_the_processes_sharing_the_queue,
        ]
    );
}

/// Runs every [`crate::Outbox`] case, one at a time. The queue must be idle and used by nobody
/// else; the outbox must be the queue's.
pub async fn run_outbox(stores: outbox::Stores<'_>) {
    run_cases!(
        "outbox",
        stores,
        [
            outbox::accept_commits_each_key_once,
            outbox::accept_refuses_stray_jobs,
            outbox::accept_leases_new_due_jobs,
            outbox_order::accepted_jobs_of_an_order_key_keep_the_order_of_acceptance,
            outbox::settle_records_attempts_with_outcomes,
            outbox::shipments_hand_over_each_record_once,
            outbox::trace_contexts_travel_with_events,
            outbox::pruned_keys_are_accepted_again,
        ]
    );
}

/// Runs every [`EntityStore`] case. Cases use their own tenants, so the store may be shared.
pub async fn run_entity_store(store: &dyn EntityStore) {
    run_cases!(
        "entity",
        store,
        [
            entity::tenant_upsert_get_delete,
            entity::destination_crud,
            entity::destination_patch_changes_only_given_fields,
            entity::destination_filters_are_kept_replaced_and_cleared,
            entity_limits::destination_rate_limits_are_kept_replaced_and_cleared,
            entity_limits::destination_transforms_are_kept_replaced_and_cleared,
            entity_limits::destination_types_and_configs_are_kept_as_given,
            entity_health::delivery_health_disables_and_recovers,
            entity::destinations_are_tenant_scoped,
            entity::secret_rotation_keeps_the_previous_secret,
            entity::deleting_a_tenant_removes_its_destinations,
        ]
    );
}

/// Runs every [`ReplayStore`] case. Cases use their own tenants and assert only on their own
/// replays, so the store may be shared.
pub async fn run_replay_store(store: &dyn ReplayStore) {
    run_cases!(
        "replay",
        store,
        [
            replay::replays_round_trip_and_are_tenant_scoped,
            replay::progress_is_saved_under_the_lease,
            replay_takeover::expired_replays_are_taken_over_once,
            replay_takeover::released_replays_are_taken_over_at_once,
            replay::finished_replays_are_deleted_by_age,
        ]
    );
}

/// Runs the [`ReplayStore`] cases of a store that shares a queue
/// ([`ReplayStore::commits_queue_work`]). The queue must be idle and used by nobody else.
pub async fn run_replay_pages(stores: replay_pages::PageStores<'_>) {
    run_cases!(
        "replay",
        stores,
        [replay_pages::page_work_commits_with_progress]
    );
}

/// Panics unless `result` is an error of `kind`.
pub(crate) fn assert_kind<T: Debug>(result: Result<T>, kind: ErrorKind, what: &str) {
    match result {
        Err(e) if e.kind() == kind => {}
        Err(e) => panic!("{what}: expected a {kind:?} error, got {:?}: {e}", e.kind()),
        Ok(value) => panic!("{what}: expected a {kind:?} error, got Ok({value:?})"),
    }
}
