-- The pages database belongs to fence_owner, who runs `gateway setup`
-- (migrations, grants, the lease table); nobody else may create in it.
-- After 20-roles.sql, in the postgres container's first start.
alter database pages owner to fence_owner;
