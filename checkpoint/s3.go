package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
)

// Deadlines of the S3 calls: every request runs under one of them, on top
// of the caller's context. The SDK's standard retryer retries 5xx answers,
// throttling and time-outs with jittered exponential backoff, up to
// s3Attempts attempts.
var (
	s3ObjectTimeout = 10 * time.Minute // one object's Put or Get
	s3CallTimeout   = time.Minute      // List, Delete, HeadBucket
	s3Attempts      = 5
	s3MaxBackoff    = 5 * time.Second
)

type s3Store struct {
	loc    string // s3://bucket/prefix, as given
	bucket string
	prefix string // "" or "a/b/"
	client *s3.Client
	where  string // the endpoint, for messages
}

// openS3 parses s3://bucket/prefix[?path-style=true], loads the standard
// AWS configuration (environment, shared config and credentials files) and
// checks that the bucket exists and the credentials are accepted.
func openS3(ctx context.Context, loc string) (*s3Store, error) {
	u, err := url.Parse(loc)
	if err != nil || u.Scheme != "s3" || u.Host == "" {
		return nil, fmt.Errorf("checkpoint: %q is not a valid location: want s3://bucket/prefix", loc)
	}
	pathStyle := false
	for _, v := range []string{os.Getenv("AWS_S3_FORCE_PATH_STYLE"), u.Query().Get("path-style")} {
		if b, err := strconv.ParseBool(v); err == nil && b {
			pathStyle = true
		}
	}
	s := &s3Store{loc: strings.TrimSuffix(strings.SplitN(loc, "?", 2)[0], "/"), bucket: u.Host, prefix: strings.Trim(u.Path, "/")}
	if s.prefix != "" {
		s.prefix += "/"
	}
	hc := awshttp.NewBuildableClient().
		WithDialerOptions(func(d *net.Dialer) { d.Timeout = 10 * time.Second }).
		WithTransportOptions(func(t *http.Transport) { t.ResponseHeaderTimeout = 2 * time.Minute })
	cctx, cancel := context.WithTimeout(ctx, s3CallTimeout)
	defer cancel()
	cfg, err := config.LoadDefaultConfig(cctx,
		config.WithHTTPClient(hc),
		config.WithRetryer(func() aws.Retryer {
			return retry.NewStandard(func(o *retry.StandardOptions) {
				o.MaxAttempts = s3Attempts
				o.MaxBackoff = s3MaxBackoff
			})
		}))
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %s: loading the AWS configuration: %w", loc, err)
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1" // S3-compatible servers accept any region
	}
	s.where = "AWS S3"
	if cfg.BaseEndpoint != nil {
		s.where = *cfg.BaseEndpoint
	}
	s.client = s3.NewFromConfig(cfg, func(o *s3.Options) { o.UsePathStyle = pathStyle })
	_, err = s.client.HeadBucket(cctx, &s3.HeadBucketInput{Bucket: aws.String(s.bucket)})
	if err != nil {
		return nil, s.err("checking the bucket", "", err)
	}
	return s, nil
}

// err turns an S3 error into one that names the location and says what to
// do.
func (s *s3Store) err(op, key string, err error) error {
	what := s.loc
	if key != "" {
		what += "/" + key
	}
	var ae smithy.APIError
	if errors.As(err, &ae) {
		switch ae.ErrorCode() {
		case "NoSuchBucket":
			return fmt.Errorf("checkpoint: %s: %s: bucket %q does not exist on %s: create it, or fix the location: %w", what, op, s.bucket, s.where, err)
		case "NotFound":
			if key == "" {
				return fmt.Errorf("checkpoint: %s: %s: bucket %q does not exist on %s: create it, or fix the location: %w", what, op, s.bucket, s.where, err)
			}
			return fmt.Errorf("%s: %w", key, fs.ErrNotExist)
		case "NoSuchKey":
			return fmt.Errorf("%s: %w", key, fs.ErrNotExist)
		case "InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "Forbidden", "InvalidToken", "ExpiredToken", "InvalidClientTokenId":
			return fmt.Errorf("checkpoint: %s: %s: %s refused the credentials (%s): check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) and the bucket's permissions: %w", what, op, s.where, ae.ErrorCode(), err)
		case "QuotaExceeded", "EntityTooLarge", "InsufficientStorage", "XMinioStorageFull":
			return fmt.Errorf("checkpoint: %s: %s: the S3 service is out of space or quota (%s); the previous checkpoint is kept: %w", what, op, ae.ErrorCode(), err)
		}
	}
	return fmt.Errorf("checkpoint: %s: %s on %s: %w", what, op, s.where, err)
}

// Put implements Store: PutObject is atomic (the object appears whole or not
// at all) and durable when it returns.
func (s *s3Store) Put(ctx context.Context, key string, data ...[]byte) error {
	var body []byte
	if len(data) == 1 {
		body = data[0]
	} else {
		body = bytes.Join(data, nil)
	}
	ctx, cancel := context.WithTimeout(ctx, s3ObjectTimeout)
	defer cancel()
	_, err := s.client.PutObject(ctx, &s3.PutObjectInput{
		Bucket: aws.String(s.bucket), Key: aws.String(s.prefix + key),
		Body: bytes.NewReader(body), ContentLength: aws.Int64(int64(len(body))),
	})
	if err != nil {
		return s.err("writing", key, err)
	}
	return nil
}

type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b cancelBody) Close() error { err := b.ReadCloser.Close(); b.cancel(); return err }

// Get implements Store.
func (s *s3Store) Get(ctx context.Context, key string) (io.ReadCloser, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, s3ObjectTimeout)
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(s.prefix + key)})
	if err != nil {
		cancel()
		return nil, 0, s.err("reading", key, err)
	}
	return cancelBody{out.Body, cancel}, aws.ToInt64(out.ContentLength), nil
}

// List implements Store.
func (s *s3Store) List(ctx context.Context, prefix string) ([]string, error) {
	var out []string
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{Bucket: aws.String(s.bucket), Prefix: aws.String(s.prefix + prefix)})
	for p.HasMorePages() {
		cctx, cancel := context.WithTimeout(ctx, s3CallTimeout)
		page, err := p.NextPage(cctx)
		cancel()
		if err != nil {
			return nil, s.err("listing", prefix, err)
		}
		for _, o := range page.Contents {
			out = append(out, strings.TrimPrefix(aws.ToString(o.Key), s.prefix))
		}
	}
	return out, nil
}

// Delete implements Store.
func (s *s3Store) Delete(ctx context.Context, key string) error {
	ctx, cancel := context.WithTimeout(ctx, s3CallTimeout)
	defer cancel()
	if _, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(s.prefix + key)}); err != nil {
		if err := s.err("deleting", key, err); errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return s.err("deleting", key, err)
	}
	return nil
}

func (s *s3Store) String() string { return s.loc }
