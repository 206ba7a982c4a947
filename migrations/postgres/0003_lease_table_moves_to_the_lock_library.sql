-- The lease table of the `lease-postgres` lock backend no longer belongs to
-- the gateway's schema: the lock library (`locks/`, crate `fencelock`) creates
-- its own table (`fencelock_leases` by default, with a `client_id` column the
-- gateway's issuer check reads) when a lease table connects, so that using
-- the library never creates the gateway's tables in a host application's
-- database. 0002 is kept because applied migrations are never edited; this
-- drops the table it created, which nothing reads any more.
drop table if exists locks;
