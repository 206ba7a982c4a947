-- MariaDB's logins for the `lease-mysql` lock service, run once by root
-- when the server is created (compose mounts it into
-- /docker-entrypoint-initdb.d/; scripts/stack runs it after
-- mariadb-install-db). `gateway setup` with fence_owner's URL then installs
-- the lease table and its functions and grants: the lock clients may only
-- EXECUTE them, the issuer only read (docs/OPERATIONS.md, "Who may do
-- what").
--
-- NOT SECRET: these passwords are published with the code, as the API keys
-- are. For anything but this demo, make your own and keep them out of git.
create database if not exists locks;
create user if not exists 'fence_owner'@'%' identified by 'demo-mariadb-fence-owner-not-secret';
grant all on locks.* to 'fence_owner'@'%' with grant option;
create user if not exists 'fence_lock_client'@'%' identified by 'demo-mariadb-fence-lock-client-not-secret';
create user if not exists 'fence_issuer'@'%' identified by 'demo-mariadb-fence-issuer-not-secret';
