package checkpoint

import (
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
)

// Deadlines of the S3 calls: every request runs under one of them, on top
// of the caller's context. The SDK's standard retryer retries 5xx answers,
// throttling and time-outs with jittered exponential backoff, up to
// s3Attempts attempts.
var (
	s3ObjectTimeout = 10 * time.Minute // one PutObject, Get, or part of a multipart upload
	s3CallTimeout   = time.Minute      // List, Delete, HeadBucket
	s3DrainTimeout  = 5 * time.Second  // the parts in flight when a multipart upload fails
	s3AbortTimeout  = 15 * time.Second // AbortMultipartUpload, after a failure
	s3Attempts      = 5
	s3MaxBackoff    = 5 * time.Second
)

// Multipart uploads: an object above s3MultipartThreshold bytes is written
// in parts of s3PartSize bytes (more if it would take over s3MaxParts
// parts), s3PartsInFlight at a time, each part under s3ObjectTimeout. S3
// wants parts of at least 5 MiB, but for the last.
var (
	s3MultipartThreshold int64 = 64 << 20
	s3PartSize           int64 = 16 << 20
	s3PartsInFlight            = 4
)

const s3MaxParts = 10000

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
	// An endpoint URL means a server that is not AWS (MinIO, Ceph,
	// versitygw, a cloud's S3-compatible service) unless it is AWS's own:
	// such servers take path-style requests, where a virtual-hosted
	// bucket name (bucket.localhost) often does not even resolve; and
	// the job runs off EC2, so the SDK must not wait on the instance
	// metadata service for credentials. AWS_S3_FORCE_PATH_STYLE or
	// ?path-style= decide when given.
	endpoint := cmp.Or(os.Getenv("AWS_ENDPOINT_URL_S3"), os.Getenv("AWS_ENDPOINT_URL"))
	notAWS := endpoint != "" && !isAWSEndpoint(endpoint)
	pathStyle := notAWS
	for _, v := range []string{os.Getenv("AWS_S3_FORCE_PATH_STYLE"), u.Query().Get("path-style")} {
		if b, err := strconv.ParseBool(v); err == nil {
			pathStyle = b
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
	opts := []func(*config.LoadOptions) error{
		config.WithHTTPClient(hc),
		config.WithRetryer(func() aws.Retryer {
			return retry.NewStandard(func(o *retry.StandardOptions) {
				o.MaxAttempts = s3Attempts
				o.MaxBackoff = s3MaxBackoff
			})
		}),
	}
	if notAWS {
		opts = append(opts, config.WithEC2IMDSClientEnableState(imds.ClientDisabled))
	}
	cfg, err := config.LoadDefaultConfig(cctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %s: loading the AWS configuration: %w", loc, err)
	}
	if cfg.Credentials != nil {
		if _, err := cfg.Credentials.Retrieve(cctx); err != nil {
			msg := fmt.Sprintf("%s: no AWS credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE", s.loc)
			if p := os.Getenv("AWS_PROFILE"); p != "" {
				msg = fmt.Sprintf("%s: the credentials of AWS_PROFILE %q could not be loaded (%s): check the profile in ~/.aws, or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY", s.loc, p, s3Cause(err))
			}
			return nil, pkgErr(&s3Error{err: err, msg: msg, recur: "has no credentials that load"})
		}
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1" // S3-compatible servers accept any region
	}
	s.where = "AWS S3"
	if cfg.BaseEndpoint != nil {
		s.where = *cfg.BaseEndpoint
	}
	s.client = s3.NewFromConfig(cfg, func(o *s3.Options) {
		o.UsePathStyle = pathStyle
		// The SDK cannot check the composite checksum ("…-N") of an object
		// written in N parts, and would log a warning at every Get of one;
		// the manifest's sha256 checks every object whole anyway.
		o.DisableLogOutputChecksumValidationSkipped = true
	})
	_, err = s.client.HeadBucket(cctx, &s3.HeadBucketInput{Bucket: aws.String(s.bucket)})
	if err != nil {
		return nil, pkgErr(s.err("checking the bucket", "", err))
	}
	return s, nil
}

// err turns an S3 error into one that names the object and says what to
// do, with the cause in a few words (s3Cause) and the SDK's whole error
// behind it for errors.Is and errors.As. Like DirStore's, it does not
// start with the package's "checkpoint: ": the Manager wraps the errors of
// Put, Get, List and Delete in its own, and the package's functions that
// return one as it is (Scan, List, Remove) add the prefix. The errors of
// openS3, which New and Scan return as they are, get it from pkgErr.
func (s *s3Store) err(op, key string, err error) error {
	what := s.loc
	if key != "" {
		what += "/" + key
	}
	short := func(format string, args ...any) *s3Error {
		return &s3Error{msg: fmt.Sprintf(format, args...), err: err}
	}
	lasting := func(recur string, e *s3Error) error { e.recur = recur; return e }
	var ae smithy.APIError
	if errors.As(err, &ae) {
		noBucket := fmt.Sprintf("has no bucket %q", s.bucket)
		switch code := ae.ErrorCode(); code {
		case "NoSuchBucket":
			return lasting(noBucket, short("%s: %s: bucket %q does not exist on %s: create it, or fix the location", what, op, s.bucket, s.where))
		case "NotFound":
			if key == "" {
				return lasting(noBucket, short("%s: %s: bucket %q does not exist on %s: create it, or fix the location", what, op, s.bucket, s.where))
			}
			return fmt.Errorf("%s: %w", key, fs.ErrNotExist)
		case "NoSuchKey":
			return fmt.Errorf("%s: %w", key, fs.ErrNotExist)
		case "InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "Forbidden", "InvalidToken", "ExpiredToken", "InvalidClientTokenId":
			return lasting("refuses the credentials ("+code+")", short("%s: %s: %s refused the credentials (%s): check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) and the bucket's permissions", what, op, s.where, code))
		case "QuotaExceeded", "EntityTooLarge", "InsufficientStorage", "XMinioStorageFull":
			return lasting("is out of space or quota ("+code+")", short("%s: %s: the S3 service is out of space or quota (%s): free space or raise the quota", what, op, code))
		}
	}
	return short("%s: %s: %s (%s)", what, op, s3Cause(err), s.where)
}

// s3Error is a storage error as the user reads it (msg: what, where and
// the cause in a few words) over the SDK's own (err), which carries the
// request, the attempts and the whole chain.
type s3Error struct {
	msg   string
	err   error
	recur string // what the store is, when a restart would fail the same way (recurs): "refuses the credentials (AccessDenied)"
}

func (e *s3Error) Error() string { return e.msg }
func (e *s3Error) Unwrap() error { return e.err }

// s3Cause is the cause of an SDK error in a few words: the service's
// error code and message, or the network error (connection refused, no
// such host, a timeout), and how many attempts it took. The SDK's own
// text leads with the operation and empty request IDs and ends with the
// cause, hundreds of characters later.
func s3Cause(err error) string {
	var cause string
	var ae smithy.APIError
	var dns *net.DNSError
	var op *net.OpError
	var ue *url.Error
	var ce *causedError
	switch {
	case errors.As(err, &ce):
		cause = ce.cause.Error()
	case errors.As(err, &ae):
		cause = strings.TrimSuffix(ae.ErrorCode()+": "+ae.ErrorMessage(), ": ")
	case errors.As(err, &dns):
		cause = dns.Error()
	case errors.As(err, &op):
		cause = op.Err.Error()
	case errors.Is(err, context.DeadlineExceeded):
		cause = "timed out"
	case errors.Is(err, context.Canceled):
		cause = "cancelled"
	case errors.As(err, &ue): // its text repeats the method and URL
		cause = ue.Err.Error()
	default:
		cause = sdkNoise.ReplaceAllString(err.Error(), "")
	}
	var ma *retry.MaxAttemptsError
	if errors.As(err, &ma) {
		cause += fmt.Sprintf(", after %d attempts", ma.Attempt)
	}
	return cause
}

// sdkNoise is what the SDK's errors say before their cause: the
// operation, empty request IDs, the attempts (said separately).
var sdkNoise = regexp.MustCompile(`operation error [^,]*, |https? response error StatusCode: \d+, RequestID: [^,]*, HostID: [^,]*, |exceeded maximum number of attempts, \d+, |request send failed, `)

// causeErr is err from a request made under ctx, said with ctx's cause
// when ctx ended with one of its own (the storage deadline, a retention
// cut short): the SDK's error only says "context canceled". It still
// unwraps to err.
func causeErr(ctx context.Context, err error) error {
	if ctx.Err() == nil {
		return err
	}
	if cause := context.Cause(ctx); cause != ctx.Err() {
		return &causedError{cause: cause, err: err}
	}
	return err
}

// causedError is an SDK error (err) whose cause is the end of its context
// (cause).
type causedError struct{ cause, err error }

func (e *causedError) Error() string   { return e.cause.Error() }
func (e *causedError) Unwrap() []error { return []error{e.err, e.cause} }

// isAWSEndpoint says whether an endpoint URL is AWS's own S3.
func isAWSEndpoint(endpoint string) bool {
	u, err := url.Parse(endpoint)
	if err != nil {
		return false
	}
	h := u.Hostname()
	return strings.HasSuffix(h, ".amazonaws.com") || strings.HasSuffix(h, ".amazonaws.com.cn")
}

// pkgErr prefixes an error that a caller returns as it is.
func pkgErr(err error) error { return fmt.Errorf("checkpoint: %w", err) }

// Put implements Store. An object of up to s3MultipartThreshold bytes is one
// PutObject, which is atomic (the object appears whole or not at all) and
// durable when it returns. A bigger one is a multipart upload, which is
// atomic too: the object appears at CompleteMultipartUpload. The body is
// read from data in place, never copied into one buffer.
func (s *s3Store) Put(ctx context.Context, key string, data ...[]byte) error {
	var size int64
	for _, d := range data {
		size += int64(len(d))
	}
	if size > s3MultipartThreshold {
		return s.putMultipart(ctx, key, size, data)
	}
	ctx, cancel := context.WithTimeout(ctx, s3ObjectTimeout)
	defer cancel()
	_, err := s.client.PutObject(ctx, &s3.PutObjectInput{
		Bucket: aws.String(s.bucket), Key: aws.String(s.prefix + key),
		Body: newChunkReader(data, 0, size), ContentLength: aws.Int64(size),
	})
	if err != nil {
		return s.err("writing", key, causeErr(ctx, err))
	}
	return nil
}

// s3PartLayout is the part size and the number of parts of a multipart
// upload of size bytes: s3PartSize, or more if it would take more parts
// than S3 allows.
func s3PartLayout(size int64) (partSize int64, parts int) {
	partSize = s3PartSize
	if least := (size + s3MaxParts - 1) / s3MaxParts; partSize < least {
		partSize = (least + 1<<20 - 1) &^ (1<<20 - 1) // whole MiB
	}
	return partSize, int((size + partSize - 1) / partSize)
}

// putMultipart writes key in parts of s3PartSize, s3PartsInFlight at a time,
// each part retried by the SDK's retryer under its own deadline. If a part
// fails, or ctx is done, no more parts start, the parts in flight get
// s3DrainTimeout to finish, and the upload is aborted, so that the server
// discards the parts it stored.
//
// An abort that fails too leaves the upload (Upload, s3uploads.go), which
// gorun checkpoint ls shows and rm, or the retention of the job's next
// save, aborts.
//
// The parts in flight are not cancelled at once because a server may go on
// storing a part whose request was cut off, and store it after the abort:
// AWS then keeps it billed until the upload is aborted again, and versitygw
// recreates the aborted upload's directory on disk, where nothing lists it.
func (s *s3Store) putMultipart(ctx context.Context, key string, size int64, data [][]byte) error {
	partSize, nparts := s3PartLayout(size)
	bucket, okey := aws.String(s.bucket), aws.String(s.prefix+key)
	cctx, cancel := context.WithTimeout(ctx, s3CallTimeout)
	up, err := s.client.CreateMultipartUpload(cctx, &s3.CreateMultipartUploadInput{
		Bucket: bucket, Key: okey, ChecksumAlgorithm: types.ChecksumAlgorithmCrc32,
	})
	cancel()
	if err != nil {
		return s.err("starting a multipart upload", key, causeErr(ctx, err))
	}
	id := up.UploadId

	// uctx stops the dispatch of parts; partsCtx, cut from ctx's
	// cancellation, cancels the parts in flight once they had their grace.
	uctx, stop := context.WithCancel(ctx)
	defer stop()
	partsCtx, stopParts := context.WithCancel(context.WithoutCancel(ctx))
	defer stopParts()
	var (
		mu     sync.Mutex
		failed error // the first failure, which names its part
		wg     sync.WaitGroup
	)
	fail := func(err error) {
		mu.Lock()
		if failed == nil {
			failed = err
			stop()
		}
		mu.Unlock()
	}
	partOp := func(n int) string { return fmt.Sprintf("writing part %d of %d of a multipart upload", n, nparts) }
	parts := make([]types.CompletedPart, nparts)
	sem := make(chan struct{}, s3PartsInFlight)
	for i := range nparts {
		if uctx.Err() == nil {
			select {
			case sem <- struct{}{}:
			case <-uctx.Done():
			}
		}
		if err := uctx.Err(); err != nil {
			fail(s.err(partOp(i+1), key, causeErr(ctx, err))) // ctx is done: a no-op if a part failed first
			break
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			lo := int64(i) * partSize
			hi := min(lo+partSize, size)
			pctx, cancel := context.WithTimeout(partsCtx, s3ObjectTimeout)
			defer cancel()
			out, err := s.client.UploadPart(pctx, &s3.UploadPartInput{
				Bucket: bucket, Key: okey, UploadId: id, PartNumber: aws.Int32(int32(i + 1)),
				Body: newChunkReader(data, lo, hi), ContentLength: aws.Int64(hi - lo),
				ChecksumAlgorithm: types.ChecksumAlgorithmCrc32,
			})
			if err != nil {
				fail(s.err(partOp(i+1), key, err))
				return
			}
			parts[i] = types.CompletedPart{PartNumber: aws.Int32(int32(i + 1)), ETag: out.ETag, ChecksumCRC32: out.ChecksumCRC32}
		}()
	}
	inFlight := make(chan struct{})
	go func() { wg.Wait(); close(inFlight) }()
	select {
	case <-inFlight:
	case <-uctx.Done(): // a part failed, or ctx is done
		select {
		case <-inFlight:
		case <-time.After(s3DrainTimeout):
			stopParts()
			<-inFlight
		}
	}
	if failed == nil && ctx.Err() != nil { // done after the last part started
		failed = s.err(fmt.Sprintf("completing a multipart upload of %d parts", nparts), key, causeErr(ctx, ctx.Err()))
	}

	if failed == nil {
		cctx, cancel := context.WithTimeout(ctx, s3ObjectTimeout)
		_, err := s.client.CompleteMultipartUpload(cctx, &s3.CompleteMultipartUploadInput{
			Bucket: bucket, Key: okey, UploadId: id,
			MultipartUpload: &types.CompletedMultipartUpload{Parts: parts},
		})
		cancel()
		if err == nil || s.completed(ctx, key, size, parts, data) {
			return nil
		}
		failed = s.err(fmt.Sprintf("completing a multipart upload of %d parts", nparts), key, causeErr(ctx, err))
	}
	// ctx may be done: the abort gets a deadline of its own. NoSuchUpload
	// says that the upload was completed or aborted already: none of its
	// parts stays.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s3AbortTimeout)
	defer cancel()
	_, err = s.client.AbortMultipartUpload(actx, &s3.AbortMultipartUploadInput{Bucket: bucket, Key: okey, UploadId: id})
	if err != nil && !noSuchUpload(err) {
		e := &s3Error{msg: fmt.Sprintf("%v; aborting the multipart upload also failed (%s): its parts stay on the server until gorun checkpoint rm, or the job's next save, aborts them",
			failed, s3Cause(err)), err: failed}
		if fe := (*s3Error)(nil); errors.As(failed, &fe) {
			e.recur = fe.recur
		}
		return e
	}
	return failed
}

// completed reports whether key holds the object of a multipart upload of
// parts (the bytes of data, size in all) that CompleteMultipartUpload
// failed to confirm. Its response may have been lost (a time-out, a reset
// connection) after the server completed the upload; the SDK's retry of it
// then gets NoSuchUpload from some servers. The object must have the size,
// the ETag's part count ("…-N") and the CRC32 checksum of the upload, the
// latter two when the server gives them.
func (s *s3Store) completed(ctx context.Context, key string, size int64, parts []types.CompletedPart, data [][]byte) bool {
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s3AbortTimeout)
	defer cancel()
	h, err := s.client.HeadObject(hctx, &s3.HeadObjectInput{
		Bucket: aws.String(s.bucket), Key: aws.String(s.prefix + key), ChecksumMode: types.ChecksumModeEnabled,
	})
	if err != nil || aws.ToInt64(h.ContentLength) != size {
		return false
	}
	etag := strings.Trim(aws.ToString(h.ETag), `"`)
	if i := strings.LastIndexByte(etag, '-'); i >= 0 {
		if n, err := strconv.Atoi(etag[i+1:]); err == nil && n != len(parts) {
			return false
		}
	}
	if sum := aws.ToString(h.ChecksumCRC32); sum != "" {
		return s3CRC32Matches(sum, parts, data)
	}
	return true
}

// s3CRC32Matches reports whether sum, an object's CRC32 checksum as S3
// gives it, is that of the upload of parts, the bytes of data: the
// composite checksum of the parts' checksums ("…-N"), or the checksum of
// the whole object. A part without a checksum cannot be told apart.
func s3CRC32Matches(sum string, parts []types.CompletedPart, data [][]byte) bool {
	h := crc32.NewIEEE()
	if c, n, ok := strings.Cut(sum, "-"); ok { // base64 has no '-'
		if n != strconv.Itoa(len(parts)) {
			return false
		}
		for _, p := range parts {
			b, err := base64.StdEncoding.DecodeString(aws.ToString(p.ChecksumCRC32))
			if err != nil || len(b) != crc32.Size {
				return true
			}
			h.Write(b)
		}
		return c == base64.StdEncoding.EncodeToString(h.Sum(nil))
	}
	for _, d := range data {
		hashPieces(h, d)
	}
	return sum == base64.StdEncoding.EncodeToString(h.Sum(nil))
}

// chunkReader reads the bytes [lo, hi) of the concatenation of some chunks
// without copying them. It seeks, so that the SDK can checksum and sign the
// body, then rewind it to send it, and again to retry.
type chunkReader struct {
	chunks [][]byte // views of the caller's chunks, none empty
	size   int64
	off    int64 // the position
	i, j   int   // chunks[i][j] is the byte at off
}

func newChunkReader(data [][]byte, lo, hi int64) *chunkReader {
	r := &chunkReader{size: hi - lo}
	var pos int64
	for _, d := range data {
		n := int64(len(d))
		if a, b := max(lo, pos), min(hi, pos+n); a < b {
			r.chunks = append(r.chunks, d[a-pos:b-pos])
		}
		if pos += n; pos >= hi {
			break
		}
	}
	return r
}

func (r *chunkReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) && r.i < len(r.chunks) {
		c := copy(p[n:], r.chunks[r.i][r.j:])
		n += c
		if r.j += c; r.j == len(r.chunks[r.i]) {
			r.i, r.j = r.i+1, 0
		}
	}
	r.off += int64(n)
	if n == 0 && len(p) > 0 {
		return 0, io.EOF
	}
	return n, nil
}

func (r *chunkReader) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		offset += r.off
	case io.SeekEnd:
		offset += r.size
	default:
		return r.off, errors.New("chunkReader: invalid whence")
	}
	if offset < 0 {
		return r.off, errors.New("chunkReader: negative position")
	}
	r.off, r.i, r.j = offset, 0, 0
	for r.i < len(r.chunks) && offset >= int64(len(r.chunks[r.i])) {
		offset -= int64(len(r.chunks[r.i]))
		r.i++
	}
	if r.i < len(r.chunks) {
		r.j = int(offset)
	}
	return r.off, nil
}

// Len is the number of bytes left to read.
func (r *chunkReader) Len() int { return int(max(r.size-r.off, 0)) }

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
		return nil, 0, s.err("reading", key, causeErr(ctx, err))
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
			return nil, s.err("listing", prefix, causeErr(ctx, err))
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
		return s.err("deleting", key, causeErr(ctx, err))
	}
	return nil
}

func (s *s3Store) String() string { return s.loc }
