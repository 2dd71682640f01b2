use crate::common::*;
use pelican::{Consumer, Producer};
use pelican_testkit::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip() {
    let server = RedisServer::start();
    let q = queue(&server, "smoke");
    let consumer = Consumer::<Req, Resp>::connect(q.clone(), fast_consumer())
        .await
        .unwrap();
    let stop = consumer.stopper();
    let w = tokio::spawn(consumer.serve(4, |r: Req, _| async move {
        Ok(Resp {
            i: r.i,
            by: "w".into(),
        })
    }));
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    for i in 0..20 {
        let r = p
            .call(&Req {
                i,
                tag: String::new(),
            })
            .await
            .unwrap();
        assert_eq!(r.i, i);
    }
    stop.stop();
    w.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dedup_crash_and_dead() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    let server = RedisServer::start();
    let q = queue(&server, "smoke2");
    let runs = Arc::new(AtomicU64::new(0));
    // a consumer that takes work and dies (never answers, never releases)
    let mut dying =
        Consumer::<Req, Resp>::connect(q.clone(), fast_consumer().with_max_deliveries(2))
            .await
            .unwrap();
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let p2 = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let t1 = p
        .submit(&Req {
            i: 7,
            tag: "x".into(),
        })
        .await
        .unwrap();
    let t2 = p2
        .submit(&Req {
            i: 7,
            tag: "x".into(),
        })
        .await
        .unwrap();
    assert_eq!(t2.submitted(), pelican::Submitted::Joined);
    let d = dying.next().await.unwrap().unwrap();
    std::mem::forget(d);
    drop(dying); // crash: the entry stays in its PEL
    let r2 = runs.clone();
    let consumer =
        Consumer::<Req, Resp>::connect(q.clone(), fast_consumer().with_max_deliveries(3))
            .await
            .unwrap();
    let stop = consumer.stopper();
    let w = tokio::spawn(consumer.serve(4, move |r: Req, _| {
        let runs = r2.clone();
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            if r.tag == "poison" {
                panic!("poison")
            }
            Ok(Resp {
                i: r.i,
                by: "w".into(),
            })
        }
    }));
    let (a, b) = tokio::join!(t1, t2);
    assert_eq!(a.unwrap().i, 7);
    assert_eq!(b.unwrap().i, 7);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let e = p
        .call(&Req {
            i: 8,
            tag: "poison".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.kind(), pelican::ErrorKind::Dead, "{e}");
    let admin = pelican::Admin::connect(q.clone()).await.unwrap();
    let dead = admin.dead_letters(10).await.unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    // cached
    let t3 = p2
        .submit(&Req {
            i: 7,
            tag: "x".into(),
        })
        .await
        .unwrap();
    assert_eq!(t3.submitted(), pelican::Submitted::Cached);
    stop.stop();
    w.await.unwrap().unwrap();
    let st = admin.stats().await.unwrap();
    println!("{st:#?}");
}
