create table if not exists {table} (
    -- Compared byte for byte: `page:demo` and `page:DEMO` are two locks.
    name       varbinary(255)  not null primary key,
    holder     varchar(64)     not null,
    client_id  varchar(128)    not null,
    -- The login the grant was made to: only it may renew or release the
    -- lease through the functions (null: a row of a version before them).
    login      varchar(128) character set utf8mb4 collate utf8mb4_bin null,
    token      bigint unsigned not null,
    expires_at datetime(6)     not null,
    released   boolean         not null default false,
    granted_at datetime(6)     not null,
    -- No place in the queue is live after this (an upper bound, raised by
    -- the queue's trigger): a fair grant that finds it past skips nobody.
    queued_until datetime(6)   null
) engine = InnoDB
