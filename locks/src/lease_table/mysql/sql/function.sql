create or replace function {table}_{verb}({params}) returns {returns}
not deterministic modifies sql data sql security definer
{body}
