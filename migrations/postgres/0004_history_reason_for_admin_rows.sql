-- An operator may set a page's fence through the admin
-- endpoint (`POST /admin/pages/{id}/fence`), which writes a history row with
-- method 'ADMIN', outcome 'fence_set' and client_id 'admin:<name>'. This
-- column keeps the reason the operator gave, so that the history says why a
-- fence moved down. Null on every other row.
--
-- History outcomes from now on: accepted, stale, stale_token, issuer_mismatch,
-- version_mismatch, token_not_current (refused by the issuer check before the
-- fenced statement; nothing else written), fence_set (admin).
alter table page_history add column reason text;
