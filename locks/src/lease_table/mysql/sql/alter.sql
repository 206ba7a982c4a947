alter table {target} {change}
