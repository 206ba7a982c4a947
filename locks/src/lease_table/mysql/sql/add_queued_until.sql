alter table {table} add column queued_until datetime(6) null
