alter table {target} add column if not exists {column} {column_type}
