-- The page database's logins, one per component, run once by the superuser
-- when the database is created (compose mounts it into
-- /docker-entrypoint-initdb.d/; scripts/stack runs it after initdb).
-- `gateway setup`, run as fence_owner, then grants each exactly its rights
-- (docs/OPERATIONS.md, "Who may do what").
--
-- NOT SECRET: these passwords are published with the code, as the API keys
-- are. For anything but this demo, make your own and keep them out of git.
create role fence_owner login password 'demo-fence-owner-not-secret';
create role fence_gateway login password 'demo-fence-gateway-not-secret';
create role fence_unfenced login password 'demo-fence-unfenced-not-secret';
create role fence_issuer login password 'demo-fence-issuer-not-secret';
-- The workers' group: the lease functions are granted to it. Nobody logs
-- in as it; each worker logs in as a member.
create role fence_lock_client nologin;
create role fence_worker_1 login password 'demo-fence-worker-1-not-secret' in role fence_lock_client;
create role fence_worker_2 login password 'demo-fence-worker-2-not-secret' in role fence_lock_client;
create role fence_worker_3 login password 'demo-fence-worker-3-not-secret' in role fence_lock_client;
create role fence_straggler login password 'demo-fence-straggler-not-secret' in role fence_lock_client;
create role fence_straggler_unfenced login password 'demo-fence-straggler-unfenced-not-secret' in role fence_lock_client;
