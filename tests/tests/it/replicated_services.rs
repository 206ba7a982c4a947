//! The replicated services of the harness do what the chaos rows rely on:
//! a Sentinel group fails over when its master freezes, and a ZooKeeper
//! server cut off by a partition stops serving while the other two go on.

use std::time::Duration;

use harness::{SentinelGroup, ZooKeeperHosts};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_promote_the_replica_when_the_master_freezes() {
    let mut group = SentinelGroup::start().await;
    assert_eq!(group.named_master().await, Some(0));
    group.freeze(0);
    group
        .wait_master(1, Duration::from_secs(30))
        .await
        .expect("the replica is promoted");
    assert_eq!(
        harness::sentinel::role(group.node_port(1)).await.unwrap(),
        "master"
    );
    // Thawed, the old master is turned into a replica of the new one.
    group.thaw(0);
    harness::wait_until(Duration::from_secs(30), || async {
        match harness::sentinel::role(group.node_port(0)).await {
            Ok(r) if r == "slave" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .expect("the old master becomes a replica");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_zookeeper_server_stops_serving_and_the_majority_goes_on() {
    if !harness::netns::available() {
        panic!("network namespaces need root (and `unshare`): this test cannot run here");
    }
    let mut zk = ZooKeeperHosts::start().await;
    // `start` waits for a quorum (a leader and one follower); the server cut
    // below may be the third, still joining: wait until all three serve.
    zk.wait_all_serving(Duration::from_secs(60))
        .await
        .expect("all three serve");
    let leader = zk.leader().await.expect("a leader");
    let cut = (leader + 1) % 3;
    assert_eq!(zk.mode(cut).await.as_deref(), Some("follower"));
    zk.partition(cut).unwrap();
    harness::wait_until(Duration::from_secs(30), || async {
        match zk.mode(cut).await {
            None => Ok(()),
            Some(m) => Err(m),
        }
    })
    .await
    .expect("the cut-off server stops serving (no quorum)");
    // The other two still form a quorum with the same leader.
    assert_eq!(zk.mode(leader).await.as_deref(), Some("leader"));
    zk.heal().unwrap();
    zk.wait_all_serving(Duration::from_secs(60))
        .await
        .expect("all three serve again after the heal");
}
