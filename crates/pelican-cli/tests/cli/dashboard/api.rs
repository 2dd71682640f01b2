//! The dashboard's JSON API and its rules, over HTTP, against a real Redis.

use super::http::{get, request};
use super::{bury, xlen, ClusterQueue, Dashboard, DEADLINE};
use crate::support::Env;
use pelican::{Producer, ProducerConfig};
use pelican_testkit::eventually_sync;
use serde_json::{json, Value};
use std::time::Duration;

fn keys(env: &Env, queue: &str) -> pelican::admin::Keys {
    pelican::QueueConfig::new(env.server.url(), queue).keys()
}

/// Queues are found in Redis (a partitioned queue once), unknown names and ids get
/// clear errors, and a foreign Host is refused.
#[test]
fn queues_are_found_and_bad_input_gets_clear_errors() {
    let env = Env::new("dash-api");
    let q = keys(&env, &env.queue);
    bury(&env, &q, "poison-1", r#"{"poison": true}"#);
    let mut c = redis::Client::open(env.server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    // Two partitions of one queue "parted": keys pelican:{parted#0}:..., {parted#1}.
    for tag in ["parted#0", "parted#1"] {
        let k = pelican::admin::Keys::new("pelican", tag);
        let _: String = redis::cmd("XADD")
            .arg(k.stream())
            .arg("*")
            .arg("rid")
            .arg("r")
            .query(&mut c)
            .unwrap();
    }
    let d = Dashboard::start(&env, &[]);
    let mine = d.wait_for_queue(&env.queue);
    assert_eq!(mine["dead_letters"], 1, "{mine}");
    let parted = d.wait_for_queue("parted");
    assert_eq!(
        parted["partitions"],
        serde_json::json!(["parted#0", "parted#1"])
    );
    assert_eq!(parted["queued"], 2, "{parted}");
    let all = get(&d.addr, "/api/queues").json();
    let names: Vec<&str> = all["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names.iter().filter(|n| **n == "parted").count(),
        1,
        "{names:?}"
    );
    assert!(!names.iter().any(|n| n.contains('#')), "{names:?}");

    // The page and the API of a queue that exists.
    let page = get(&d.addr, &format!("/queues/{}", env.queue));
    assert_eq!(page.status, 200);
    assert!(page.body.contains("/assets/app.js"), "{page:?}");
    let one = get(&d.addr, &format!("/api/queues/{}", env.queue)).json();
    assert_eq!(one["queue"]["name"], env.queue.as_str());
    let dead = get(&d.addr, &format!("/api/queues/{}/dead", env.queue)).json();
    assert_eq!(dead["total"], 1);
    assert_eq!(dead["letters"][0]["rid"], "poison-1");
    assert_eq!(dead["letters"][0]["deliveries"], 3);
    assert_eq!(dead["letters"][0]["body_preview"], r#"{"poison": true}"#);

    // Unknown queue: 404, as JSON and as a page, saying which queues there are.
    let a = get(&d.addr, "/api/queues/nope");
    assert_eq!(a.status, 404, "{a:?}");
    let msg = a.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        msg.contains("no queue \"nope\"") && msg.contains("parted"),
        "{msg}"
    );
    let p = get(&d.addr, "/queues/nope");
    assert_eq!(p.status, 404);
    assert!(p.body.contains("No such queue"), "{p:?}");
    // Not a queue name at all (a brace): 400.
    let b = get(&d.addr, "/api/queues/bad%7Bname/dead");
    assert_eq!(b.status, 400, "{b:?}");
    assert!(
        b.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("queue name"),
        "{b:?}"
    );
    assert_eq!(get(&d.addr, "/queues/bad%7Bname").status, 400);
    // Unknown and malformed request ids.
    let r = get(
        &d.addr,
        &format!("/api/queues/{}/requests/never-seen", env.queue),
    );
    assert_eq!(r.status, 404, "{r:?}");
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("knows no request"));
    let long = "x".repeat(300);
    let r = get(
        &d.addr,
        &format!("/api/queues/{}/requests/{long}", env.queue),
    );
    assert_eq!(r.status, 400, "{r:?}");
    // No such route.
    assert_eq!(get(&d.addr, "/api/nothing").status, 404);
    assert_eq!(get(&d.addr, "/nothing").status, 404);
    // A page of another site whose name points at 127.0.0.1 (DNS rebinding): refused.
    let evil = request(
        &d.addr,
        "GET",
        "/api/queues",
        &[("Host", "evil.example:80")],
    );
    assert_eq!(evil.status, 403, "{evil:?}");
    assert!(evil.body.contains("loopback host name"), "{evil:?}");
    // Security headers on every answer.
    let csp = page.header("content-security-policy").unwrap();
    assert!(csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"));
}

/// Requeue and purge need the token and the dashboard's own origin: 401 without the
/// token, 403 from another origin, and nothing changes until both are right.
#[test]
fn mutations_need_the_token_and_the_own_origin() {
    let env = Env::new("dash-auth");
    let q = keys(&env, &env.queue);
    let id = bury(&env, &q, "poison-2", r#"{"n": 2}"#);
    let d = Dashboard::start(&env, &[]);
    d.wait_for_queue(&env.queue);
    let token = d.token.clone().expect("a login link with a token");
    assert_eq!(token.len(), 32, "a random 128-bit token: {token}");
    let path = format!("/api/queues/{}/dead/{id}/requeue", env.queue);
    let own = format!("http://{}", d.addr);
    // The login link starts a session: its id is the cookie (never the token).
    let login = get(&d.addr, &format!("/login?token={token}"));
    assert_eq!(login.status, 303, "{login:?}");
    let set = login.header("set-cookie").unwrap().to_string();
    let cookie = set.split(';').next().unwrap().to_string();
    assert!(cookie.starts_with("pelican_dashboard="), "{set}");

    let a = request(&d.addr, "POST", &path, &[("Origin", &own)]);
    assert_eq!(a.status, 401, "{a:?}");
    assert!(a.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("login link"));
    let a = request(
        &d.addr,
        "POST",
        &path,
        &[
            ("Origin", &own),
            ("Cookie", "pelican_dashboard=0123456789abcdef0123"),
        ],
    );
    assert_eq!(a.status, 401, "{a:?}");
    let a = request(
        &d.addr,
        "POST",
        &path,
        &[("Origin", "http://evil.example"), ("Cookie", &cookie)],
    );
    assert_eq!(a.status, 403, "{a:?}");
    let a = request(
        &d.addr,
        "POST",
        &path,
        &[("Sec-Fetch-Site", "cross-site"), ("Cookie", &cookie)],
    );
    assert_eq!(a.status, 403, "{a:?}");
    // A cookie alone, with no sign of where the request comes from: refused too.
    let a = request(&d.addr, "POST", &path, &[("Cookie", &cookie)]);
    assert_eq!(a.status, 403, "{a:?}");
    assert_eq!(xlen(&env, q.dead()), 1, "nothing was requeued yet");
    let info = get(&d.addr, "/api/info").json();
    assert_eq!(info["can_mutate"], false);

    // The login link sent the browser to the overview.
    assert_eq!(login.header("location"), Some("/"));
    assert!(set.contains("HttpOnly") && set.contains("SameSite=Strict"));
    assert_eq!(get(&d.addr, "/login?token=wrong").status, 401);
    let to_queue = get(
        &d.addr,
        &format!("/login?token={token}&next=/queues/{}", env.queue),
    );
    assert_eq!(
        to_queue.header("location"),
        Some(format!("/queues/{}", env.queue).as_str())
    );
    for elsewhere in [
        "//evil.example",
        "https://evil.example",
        "/queues/",
        "/api/queues",
    ] {
        let a = get(&d.addr, &format!("/login?token={token}&next={elsewhere}"));
        assert_eq!(a.header("location"), Some("/"), "next={elsewhere}");
    }
    let info = request(&d.addr, "GET", "/api/info", &[("Cookie", &cookie)]).json();
    assert_eq!(info["can_mutate"], true);

    // Bad and unknown ids, with the token.
    let bad = request(
        &d.addr,
        "POST",
        &format!("/api/queues/{}/dead/not-an-id/requeue", env.queue),
        &[("Origin", &own), ("Cookie", &cookie)],
    );
    assert_eq!(bad.status, 400, "{bad:?}");
    assert!(bad.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("not a dead-letter id"));
    let gone = request(
        &d.addr,
        "POST",
        &format!("/api/queues/{}/dead/1-999/requeue", env.queue),
        &[("Origin", &own), ("Cookie", &cookie)],
    );
    assert_eq!(gone.status, 404, "{gone:?}");

    // The page's own request: requeued, the letter leaves the dead-letter stream and a
    // fresh entry is queued.
    let ok = request(
        &d.addr,
        "POST",
        &path,
        &[
            ("Origin", &own),
            ("Sec-Fetch-Site", "same-origin"),
            ("Cookie", &cookie),
        ],
    );
    assert_eq!(ok.status, 200, "{ok:?}");
    assert_eq!(ok.json()["id"], id.as_str());
    assert_eq!(xlen(&env, q.dead()), 0);
    assert_eq!(xlen(&env, q.stream()), 1);

    // A script with the token in the Authorization header: purge.
    bury(&env, &q, "poison-3", "{}");
    bury(&env, &q, "poison-4", "{}");
    let purge = format!("/api/queues/{}/dead/purge", env.queue);
    let a = request(
        &d.addr,
        "POST",
        &purge,
        &[("Authorization", "Bearer nope-nope-nope-nope")],
    );
    assert_eq!(a.status, 403, "{a:?}");
    assert_eq!(xlen(&env, q.dead()), 2);
    let auth = format!("Bearer {token}");
    let a = request(&d.addr, "POST", &purge, &[("Authorization", &auth)]);
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.json()["purged"], 2);
    assert_eq!(xlen(&env, q.dead()), 0);
}

/// `--read-only` serves no mutation at all, whatever the request carries.
#[test]
fn read_only_serves_no_mutation() {
    let env = Env::new("dash-ro");
    let q = keys(&env, &env.queue);
    let id = bury(&env, &q, "poison-5", "{}");
    let d = Dashboard::start(&env, &["--read-only", "--token", "read-only-token-123456"]);
    assert!(d.proc.stdout().contains("read-only"), "{}", d.proc.stdout());
    d.wait_for_queue(&env.queue);
    let own = format!("http://{}", d.addr);
    for path in [
        format!("/api/queues/{}/dead/{id}/requeue", env.queue),
        format!("/api/queues/{}/dead/requeue-all", env.queue),
        format!("/api/queues/{}/dead/purge", env.queue),
    ] {
        let a = request(
            &d.addr,
            "POST",
            &path,
            &[
                ("Origin", &own),
                ("Authorization", "Bearer read-only-token-123456"),
            ],
        );
        assert!(a.status == 404 || a.status == 405, "{path}: {a:?}");
    }
    assert_eq!(xlen(&env, q.dead()), 1, "nothing changed");
    let info = get(&d.addr, "/api/info").json();
    assert_eq!(info["read_only"], true);
    assert_eq!(info["can_mutate"], false);
}

/// A non-loopback address needs a token; a weak token is refused.
#[test]
fn refuses_a_public_address_without_a_token() {
    let env = Env::new("dash-listen");
    let out = env.run(&["dashboard", "--listen", "0.0.0.0:0"]);
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("without --token"), "{out:?}");
    let out = env.run(&["dashboard", "--token", "short"]);
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("at least 16"), "{out:?}");
    let out = env.run(&["dashboard", "--prefix", "bad{prefix"]);
    assert_eq!(out.code, 2, "{out:?}");
    // A cluster must answer at start (its connection learns the nodes then): a failure
    // that names the seeds it tried.
    let port = pelican_testkit::free_port();
    let mut cmd = crate::support::pelican();
    cmd.args([
        "--redis",
        &format!("redis+cluster://127.0.0.1:{port}"),
        "dashboard",
    ]);
    let out = crate::support::run(cmd);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.stderr.contains(&format!("tried 127.0.0.1:{port}")),
        "{out:?}"
    );
}

/// Redis going away is shown, not fatal: the overview reports it, calls that need Redis
/// answer 503 with the cause, and the page still loads.
#[test]
fn redis_down_is_reported_and_the_dashboard_lives_on() {
    let mut env = Env::new("dash-down");
    let q = keys(&env, &env.queue);
    bury(&env, &q, "poison-6", "{}");
    let d = Dashboard::start(&env, &[]);
    d.wait_for_queue(&env.queue);
    env.server.kill();
    eventually_sync(DEADLINE, "the overview to report Redis down", || {
        get(&d.addr, "/api/queues").json()["error"]
            .as_str()
            .is_some_and(|e| e.contains("cannot read Redis"))
    });
    let a = get(&d.addr, &format!("/api/queues/{}/dead", env.queue));
    assert_eq!(a.status, 503, "{a:?}");
    assert!(
        a.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Redis"),
        "{a:?}"
    );
    // The queue's numbers: the last ones read, with the error for the page's banner.
    let a = get(&d.addr, &format!("/api/queues/{}", env.queue));
    assert_eq!(a.status, 200, "{a:?}");
    assert!(a.json()["error"]
        .as_str()
        .unwrap()
        .contains("cannot read Redis"));
    assert_eq!(get(&d.addr, "/").status, 200);
    // The last numbers are kept for the page.
    let all = get(&d.addr, "/api/queues").json();
    assert_eq!(all["queues"][0]["dead_letters"], 1, "{all}");
}

/// A queue of several partitions is one queue on the dashboard, and its dead letters
/// (ids `<partition>/<id>`) are requeued in their partition.
#[test]
fn a_partitioned_queue_is_one_queue() {
    let env = Env::new("dash-parts");
    let worker = env.spawn(&["--partitions", "2", "worker", "--handler", "echo"]);
    let one = pelican::admin::Keys::partition("pelican", &env.queue, 1, 2);
    pelican_testkit::eventually_sync(DEADLINE, "the worker to create both partitions", || {
        worker.stderr().contains("serving queue")
    });
    let id = bury(&env, &one, "poison-p1", r#"{"p": 1}"#);
    let d = Dashboard::start(&env, &[]);
    let q = d.wait_for_queue(&env.queue);
    let tags = [0, 1].map(|p| {
        let k = pelican::admin::Keys::partition("pelican", &env.queue, p, 2);
        let tag = k.stream().strip_prefix("pelican:{").unwrap();
        tag.strip_suffix("}:stream").unwrap().to_string()
    });
    assert_eq!(q["partitions"], serde_json::json!(tags), "{q}");
    assert_eq!(q["dead_letters"], 1, "{q}");
    let all = get(&d.addr, "/api/queues").json();
    assert_eq!(all["queues"].as_array().unwrap().len(), 1, "{all}");
    let dead = get(&d.addr, &format!("/api/queues/{}/dead", env.queue)).json();
    assert_eq!(
        dead["letters"][0]["id"],
        format!("1/{id}").as_str(),
        "{dead}"
    );
    let token = d.token.clone().unwrap();
    let a = request(
        &d.addr,
        "POST",
        &format!("/api/queues/{}/dead/1%2F{id}/requeue", env.queue),
        &[("Authorization", &format!("Bearer {token}"))],
    );
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(xlen(&env, one.dead()), 0);
    eventually_sync(DEADLINE, "the overview to count no dead letter", || {
        get(&d.addr, "/api/queues").json()["queues"][0]["dead_letters"] == 0
    });
    drop(worker);
}

/// What a consumer holds is shown with each request's id, read from the entry's head or,
/// in the layout before it, from its `rid` field.
#[test]
fn held_requests_show_their_ids_in_either_entry_layout() {
    let env = Env::new("dash-held");
    let q = keys(&env, &env.queue);
    let mut c = redis::Client::open(env.server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(q.stream())
        .arg(q.group())
        .arg("0")
        .arg("MKSTREAM")
        .query(&mut c)
        .unwrap();
    let deadline = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 600_000)
        .to_string();
    let head = format!("held;new;p1;{deadline};0;0");
    for fields in [
        vec![("head", head.as_str()), ("body", "{}")],
        vec![
            ("rid", "held-old"),
            ("deadline", deadline.as_str()),
            ("body", "{}"),
        ],
    ] {
        let mut xadd = redis::cmd("XADD");
        xadd.arg(q.stream()).arg("*");
        for (k, v) in fields {
            xadd.arg(k).arg(v);
        }
        let _: String = xadd.query(&mut c).unwrap();
    }
    // A consumer takes both and holds them.
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(q.group())
        .arg("worker-x")
        .arg("COUNT")
        .arg(2)
        .arg("STREAMS")
        .arg(q.stream())
        .arg(">")
        .query(&mut c)
        .unwrap();
    let d = Dashboard::start(&env, &[]);
    d.wait_for_queue(&env.queue);
    let mut rids: Vec<String> = Vec::new();
    eventually_sync(DEADLINE, "worker-x's two held requests", || {
        let one = get(&d.addr, &format!("/api/queues/{}", env.queue)).json();
        rids = one["consumers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["name"] == "worker-x")
            .flat_map(|c| c["held"].as_array().cloned().unwrap_or_default())
            .filter_map(|h| h["rid"].as_str().map(str::to_string))
            .collect();
        rids.len() == 2
    });
    rids.sort();
    assert_eq!(rids, ["held-old", "held;new"]);
}

/// On a 3-master cluster: queues are found on every master; a queue of 3 partitions is
/// summed over them, and its page gives each partition's figures (queued, in flight,
/// consumers, dead letters, the master serving it); dead letters of every partition are
/// listed, requeued and purged; a request in any partition is looked up.
#[test]
fn a_queue_on_a_cluster_is_summed_over_its_partitions() {
    let cq = ClusterQueue::start("dash-cluster");
    let name = cq.queue.name.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let producer = rt
        .block_on(Producer::<Value, Value>::connect(
            cq.queue.clone(),
            ProducerConfig::default().with_request_timeout(Duration::from_secs(120)),
        ))
        .unwrap();
    // 2, 3 and 4 requests waiting in partitions 0, 1 and 2 (no worker yet).
    let mut waiting = Vec::new();
    for (p, n) in [(0u32, 2), (1, 3), (2, 4)] {
        for i in 0..n {
            let id = cq.id_in(p, &format!("wait-{p}-{i}"));
            let t = rt
                .block_on(producer.submit_with_id(&id, &json!({ "p": p, "i": i })))
                .unwrap();
            waiting.push(t.detach());
        }
    }
    let a = cq.bury(2, "poison-a", r#"{"poison": "a"}"#);
    let b = cq.bury(2, "poison-b", r#"{"poison": "b"}"#);
    let c = cq.bury(1, "poison-c", r#"{"poison": "c"}"#);
    // A queue of one partition on each master: discovery scans every one.
    let mut conn = cq.conn();
    let solos: Vec<String> = (0..3)
        .map(|m| {
            let solo = (0..)
                .map(|i| format!("solo-{m}-{i}"))
                .find(|n| {
                    cq.cluster
                        .master_of(pelican::admin::Keys::new("pelican", n).stream())
                        == m
                })
                .unwrap();
            let _: String = redis::cmd("XADD")
                .arg(pelican::admin::Keys::new("pelican", &solo).stream())
                .arg("*")
                .arg("rid")
                .arg("r")
                .query(&mut conn)
                .unwrap();
            solo
        })
        .collect();

    let d = cq.start_dashboard(&[]);
    for solo in &solos {
        d.wait_for_queue(solo);
    }
    let q = d.wait_for_queue(&name);
    assert_eq!(q["queued"], 9, "summed over the partitions: {q}");
    assert_eq!(q["dead_letters"], 3, "{q}");
    assert_eq!(q["entries_added"], 9, "{q}");
    assert_eq!(q["partitions"].as_array().map(Vec::len), Some(3), "{q}");

    // The queue's page: each partition's own figures, and where it lives.
    let part = |one: &Value, p: u32| -> Value {
        let tag_stream = cq.queue.partition_keys(p).stream().to_string();
        one["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| {
                pelican::admin::Keys::new("pelican", x["tag"].as_str().unwrap()).stream()
                    == tag_stream
            })
            .unwrap_or_else(|| panic!("no partition {p} in {one}"))
            .clone()
    };
    let one = get(&d.addr, &format!("/api/queues/{name}")).json();
    for (p, queued, dead) in [(0u32, 2, 0), (1, 3, 1), (2, 4, 2)] {
        let x = part(&one, p);
        assert_eq!(
            (x["queued"].as_u64(), x["dead_letters"].as_u64()),
            (Some(queued), Some(dead)),
            "{x}"
        );
        assert_eq!(x["length"], queued, "{x}");
        assert_eq!(x["in_flight"], 0, "{x}");
        let master = cq.cluster.master_of(cq.queue.partition_keys(p).stream());
        let port = cq.cluster.nodes()[master].port();
        assert_eq!(x["node"], format!("127.0.0.1:{port}"), "{x}");
    }

    // A worker takes everything; it reads every partition: one consumer in each.
    let worker = cq.spawn(&["worker", "--handler", "echo", "--name", "w-cluster"]);
    eventually_sync(
        DEADLINE,
        "every request answered, one consumer per partition",
        || {
            let one = get(&d.addr, &format!("/api/queues/{name}")).json();
            one["queue"]["queued"] == 0
                && one["queue"]["in_flight"] == 0
                && one["queue"]["consumers"] == 1
                && (0..3).all(|p| part(&one, p)["consumers"].as_array().map(Vec::len) == Some(1))
        },
    );
    let inspect = get(
        &d.addr,
        &format!("/api/queues/{name}/requests/{}", waiting[8]),
    )
    .json();
    assert_eq!(inspect["state"], "ok", "{inspect}");

    // Dead letters of every partition, each id with its partition.
    let dead = get(&d.addr, &format!("/api/queues/{name}/dead")).json();
    assert_eq!(dead["total"], 3, "{dead}");
    let mut ids: Vec<&str> = dead["letters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["id"].as_str().unwrap())
        .collect();
    ids.sort();
    let mut want = vec![a.as_str(), b.as_str(), c.as_str()];
    want.sort();
    assert_eq!(ids, want);

    let token = d.token.clone().unwrap();
    let login = get(&d.addr, &format!("/login?token={token}"));
    let cookie = login
        .header("set-cookie")
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let own = format!("http://{}", d.addr);
    let with = [("Origin", own.as_str()), ("Cookie", cookie.as_str())];
    // (as the page sends it: the id's `/` encoded)
    let path = format!("/api/queues/{name}/dead/{}/requeue", b.replace('/', "%2F"));
    let r = request(&d.addr, "POST", &path, &with);
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.json()["entry"].is_string(), "{r:?}");
    assert_eq!(
        cq.dead_letters(2),
        1,
        "the letter left partition 2's dead letters"
    );
    eventually_sync(DEADLINE, "the requeued letter answered", || {
        let q = get(&d.addr, &format!("/api/queues/{name}")).json()["queue"].clone();
        q["entries_added"] == 10 && q["queued"] == 0 && q["in_flight"] == 0
    });
    let r = request(
        &d.addr,
        "POST",
        &format!("/api/queues/{name}/dead/purge"),
        &with,
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["purged"], 2, "{r:?}");
    assert_eq!((cq.dead_letters(1), cq.dead_letters(2)), (0, 0));
    eventually_sync(DEADLINE, "no dead letters on the page", || {
        get(&d.addr, &format!("/api/queues/{name}")).json()["queue"]["dead_letters"] == 0
    });

    worker.signal(libc::SIGTERM);
    assert_eq!(worker.wait(Duration::from_secs(20)).code, 0);
    rt.block_on(producer.shutdown()).unwrap();

    // The whole cluster gone: shown on the page, not fatal.
    let mut cq = cq;
    for n in cq.cluster.nodes_mut() {
        n.kill();
    }
    eventually_sync(DEADLINE, "the overview to report the cluster down", || {
        get(&d.addr, "/api/queues").json()["error"]
            .as_str()
            .is_some_and(|e| e.contains("cannot read Redis"))
    });
    assert_eq!(get(&d.addr, "/api/info").status, 200);
}
