with granted as (
{grant}
)
select g.token,
       case when g.token is null then {held_for} end as wait_secs,
       null::boolean as behind
  from (select (select token from granted) as token) g
