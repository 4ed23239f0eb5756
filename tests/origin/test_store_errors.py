"""Issue 62's fragile item: a store's error body reaches a job error (and so a pod's status annotation)
only as its status, error code and message (agent.origin.bucket.store_reason)."""

from __future__ import annotations

from agent.origin.bucket import store_reason

KEY_ID = "AKIAIOSFODNN7EXAMPLE"
# S3's answer to a wrong secret, as documented (RESTErrorResponses: SignatureDoesNotMatch carries the
# access key id, the string to sign and request ids), inside obstore's error text.
S3_BODY = (
    "Generic S3 error: Error performing list request: Error performing GET "
    "http://127.0.0.1:9/bucket?list-type=2&prefix=m%2F&X-Amz-Credential=" + KEY_ID + " in 6ms - Server "
    'returned non-2xx status code: 403 Forbidden: <?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>'
    "SignatureDoesNotMatch</Code><Message>The request signature we calculated does not match the "
    f"signature you provided.</Message><AWSAccessKeyId>{KEY_ID}</AWSAccessKeyId><StringToSign>AWS4-HMAC"
    "</StringToSign><RequestId>4442587FB7D0A2F9</RequestId></Error>"
)


def test_an_s3_refusal_keeps_its_code_and_message_and_nothing_else():
    reason = store_reason(S3_BODY, "GenericError")
    assert reason == (
        "HTTP 403 SignatureDoesNotMatch: The request signature we calculated does not match the "
        "signature you provided."
    )


def test_a_body_that_begins_with_the_access_key_id_leaves_it_out():
    text = f"Server returned non-2xx status code: 403 Forbidden: {KEY_ID} is not allowed to list bucket"
    assert store_reason(text, "GenericError") == "HTTP 403"
    assert KEY_ID not in store_reason(f"Generic S3 error: {KEY_ID} refused?{KEY_ID}", "GenericError")


def test_no_answer_is_obstores_words_without_the_urls_query():
    text = "Generic S3 error: Error performing GET http://h/b?X-Amz-Signature=abc in 3s - connection refused"
    assert store_reason(text, "GenericError") == (
        "Generic S3 error: Error performing GET http://h/b in 3s - connection refused"
    )
