use crate::common::*;
use pelican::{Consumer, Producer};
use pelican_testkit::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip() {
    let server = RedisServer::start();
    let q = queue(&server, "smoke");
    let consumer = Consumer::<Req, Resp>::connect(q.clone(), fast_consumer()).await.unwrap();
    let stop = consumer.stopper();
    let w = tokio::spawn(consumer.serve(4, |r: Req, _| async move { Ok(Resp { i: r.i, by: "w".into() }) }));
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer()).await.unwrap();
    for i in 0..20 {
        let r = p.call(&Req { i, tag: String::new() }).await.unwrap();
        assert_eq!(r.i, i);
    }
    stop.stop();
    w.await.unwrap().unwrap();
}
