create table if not exists {table}_waiters (
    name       varbinary(255)  not null,
    ticket     bigint unsigned not null auto_increment,
    waiter     varchar(64)     not null,
    expires_at datetime(6)     not null,
    login      varchar(128) character set utf8mb4 collate utf8mb4_bin null,
    primary key (name, ticket),
    unique key (name, waiter),
    key (ticket)
) engine = InnoDB
