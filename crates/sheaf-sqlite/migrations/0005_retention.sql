-- Retention (SqliteLogStore::maintain) drops the oldest records first, by time, and never an
-- event a job still waits for, nor its attempts. The time indexes let each batch read only the
-- rows it deletes; the jobs index answers "is this event held" with one probe. Each costs one
-- more index entry per insert, small beside the row.

CREATE INDEX events_by_time ON events (event_time);
CREATE INDEX attempts_by_time ON attempts (attempt_time);
CREATE INDEX jobs_by_event ON jobs (tenant_id, event_id);
