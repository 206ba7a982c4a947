create table if not exists {table} (
    name       varchar(255)    not null primary key,
    holder     varchar(64)     not null,
    client_id  varchar(128)    not null,
    token      bigint unsigned not null,
    expires_at datetime(6)     not null,
    released   boolean         not null default false,
    granted_at datetime(6)     not null,
    -- No place in the queue is live after this (an upper bound, raised by
    -- the queue's trigger): a fair grant that finds it past skips nobody.
    queued_until datetime(6)   null
) engine = InnoDB
