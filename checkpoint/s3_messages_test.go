package checkpoint

import (
	"context"
	"strings"
	"testing"
)

// Errors a user can act on (issue 31, item 3), against the real server.

// No credentials at all: one line that says which variables to set, and,
// with an endpoint URL set, no wait on the EC2 metadata service.
func TestS3NoCredentials(t *testing.T) {
	startVersity(t, "ckpt")
	comms := newJob(t, 1)
	t.Setenv("AWS_ACCESS_KEY_ID", "")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "") // as on a fresh machine
	_, err := New(comms[0], "s3://ckpt/job")
	if err == nil {
		t.Fatal("New succeeded without credentials")
	}
	t.Log(err)
	for _, want := range []string{"s3://ckpt/job", "no AWS credentials found", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q", want)
		}
	}
	if strings.Contains(err.Error(), "IMDS") {
		t.Errorf("error mentions the EC2 metadata service, which a job with an endpoint URL does not use")
	}
}

// An endpoint given by host name, without AWS_S3_FORCE_PATH_STYLE: a
// server that is not AWS gets path-style requests (bucket.localhost does
// not resolve).
func TestS3EndpointByHostName(t *testing.T) {
	v := startVersity(t, "ckpt")
	t.Setenv("AWS_ENDPOINT_URL", strings.Replace(v.Endpoint(), "127.0.0.1", "localhost", 1))
	t.Setenv("AWS_S3_FORCE_PATH_STYLE", "")
	comms := newJob(t, 1)
	mustAll(t, save(t, comms, "s3://ckpt/job", 1, 1))
	restore(t, comms, "s3://ckpt/job", 1, 1)
}

// A store that is gone: the line names the object and says the cause up
// front, without the SDK's empty request IDs, and stays short.
func TestS3ErrorLineIsShort(t *testing.T) {
	v := startVersity(t, "ckpt")
	s, err := openS3(context.Background(), "s3://ckpt/job")
	if err != nil {
		t.Fatal(err)
	}
	v.Kill()
	_, _, err = s.Get(context.Background(), "step-00000001/manifest.json")
	if err == nil {
		t.Fatal("Get succeeded on a killed server")
	}
	msg := err.Error()
	t.Log(msg)
	if len(msg) > 200 {
		t.Errorf("the error is %d characters, want at most 200", len(msg))
	}
	for _, noise := range []string{"RequestID", "HostID", "StatusCode: 0"} {
		if strings.Contains(msg, noise) {
			t.Errorf("the error carries the SDK's %q", noise)
		}
	}
	for _, want := range []string{"s3://ckpt/job/step-00000001/manifest.json", "connection refused"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the error lacks %q", want)
		}
	}
}
