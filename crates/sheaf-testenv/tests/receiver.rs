//! The webhook receiver answers as scripted and counts what it answered: 200s, 503s while
//! failing, a redirect, answers held open by the delay, duplicates and resets.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use sheaf_testenv::receiver::{Failing, Receiver};

/// Posts one delivery with `id` and returns the status and the `location` header.
async fn post(http: &reqwest::Client, url: &str, id: &str) -> (u16, Option<String>) {
    let response = http
        .post(url)
        .header("webhook-id", id)
        .header("content-type", "application/json")
        .body(format!("{{\"id\":\"{id}\"}}"))
        .send()
        .await
        .expect("the receiver answers");
    let location = response
        .headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    (response.status().as_u16(), location)
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("a client")
}

#[tokio::test]
async fn it_counts_successes_duplicates_and_failures_and_forgets_on_reset() {
    let receiver = Receiver::start().await.expect("bind");
    let http = client();
    assert_eq!(post(&http, &receiver.url(), "a").await.0, 200);
    assert_eq!(post(&http, &receiver.url(), "a").await.0, 200);
    assert_eq!(post(&http, &receiver.url(), "b").await.0, 200);
    receiver.set_failing(true);
    assert_eq!(post(&http, &receiver.url(), "c").await.0, 503);
    receiver.set_failing(false);

    assert_eq!(receiver.delivered_count(), 2);
    assert_eq!(
        receiver.delivered_ids(),
        HashSet::from(["a".to_owned(), "b".to_owned()])
    );
    assert_eq!(receiver.duplicates(), 1);
    assert_eq!(receiver.requests(), (4, 1));
    let deliveries = receiver.deliveries();
    assert_eq!(
        deliveries.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(),
        ["a", "a", "b", "c"]
    );
    assert_eq!(deliveries[2].header("content-type"), "application/json");
    assert_eq!(&deliveries[2].body[..], br#"{"id":"b"}"#);
    assert!(deliveries.iter().all(|d| d.answered >= d.arrived));
    let first = receiver.first_successes();
    assert_eq!(first["a"], deliveries[0].answered);
    assert!(receiver.longest_pause(deliveries[0].answered).is_some());

    let wanted = ["a".to_owned(), "c".to_owned()];
    let missing = receiver
        .wait_for(wanted.iter(), Duration::from_millis(50))
        .await;
    assert_eq!(missing, ["c".to_owned()]);
    assert!(!receiver.delivers_all(wanted.iter(), Duration::ZERO).await);
    assert!(receiver.wait_for_count(2, Duration::ZERO).await);

    receiver.reset();
    assert_eq!(receiver.requests(), (0, 0));
    assert_eq!(receiver.delivered_count(), 0);
    assert_eq!(receiver.duplicates(), 0);
    assert!(!receiver.wait_for_count(1, Duration::from_millis(50)).await);
}

#[tokio::test]
async fn failure_scripts_decide_by_the_time_of_the_answer() {
    let always = Receiver::builder()
        .failing(Failing::Always)
        .start()
        .await
        .expect("bind");
    let http = client();
    assert_eq!(post(&http, &always.url(), "x").await.0, 503);
    assert_eq!(always.delivered_count(), 0);

    let window = Receiver::builder()
        .failing(Failing::ForAfterFirst(Duration::from_millis(300)))
        .start()
        .await
        .expect("bind");
    assert_eq!(post(&http, &window.url(), "x").await.0, 503);
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert_eq!(post(&http, &window.url(), "x").await.0, 200);

    let never = Receiver::builder()
        .failing(Failing::ForAfterFirst(Duration::ZERO))
        .start()
        .await
        .expect("bind");
    assert_eq!(post(&http, &never.url(), "x").await.0, 200);

    let until = Receiver::start().await.expect("bind");
    until.fail_until(Instant::now() + Duration::from_millis(300));
    assert_eq!(post(&http, &until.url(), "x").await.0, 503);
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert_eq!(post(&http, &until.url(), "x").await.0, 200);
}

#[tokio::test]
async fn a_delayed_answer_is_open_until_it_is_given() {
    let receiver = Receiver::builder()
        .delay(Duration::from_millis(400))
        .start()
        .await
        .expect("bind");
    let url = receiver.url();
    let pending = tokio::spawn(async move { post(&client(), &url, "slow").await.0 });
    let deadline = Instant::now() + Duration::from_secs(5);
    while receiver.open_requests() == 0 {
        assert!(Instant::now() < deadline, "the request never arrived");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(receiver.deliveries().len(), 0, "not answered yet");
    assert_eq!(pending.await.expect("the request task"), 200);
    assert_eq!(receiver.open_requests(), 0);
    let delivery = &receiver.deliveries()[0];
    assert!(delivery.answered - delivery.arrived >= Duration::from_millis(400));
}

#[tokio::test]
async fn a_redirecting_receiver_answers_307_with_the_location() {
    let receiver = Receiver::builder()
        .redirect_to("http://127.0.0.1:9/elsewhere")
        .start()
        .await
        .expect("bind");
    let (status, location) = post(&client(), &receiver.url(), "r").await;
    assert_eq!(status, 307);
    assert_eq!(location.as_deref(), Some("http://127.0.0.1:9/elsewhere"));
    assert_eq!(receiver.delivered_count(), 0);
    assert_eq!(receiver.requests(), (1, 0));
}
