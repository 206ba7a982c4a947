-- An admin may set a page's fence above what its issuer says it has minted
-- only with `"force": true` (POST /admin/pages/{id}/fence): such a fence
-- refuses every holder until the issuer's counter passes it. The history
-- row of every fence set by an admin records whether it was forced. Null on
-- every other row, and on admin rows written before this column.
alter table page_history add column force boolean;
