package checkpoint

import (
	"context"
	"errors"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
)

// The S3 store's incomplete uploads (uploadKeeper, uploads.go): its
// multipart uploads in progress.

var _ uploadKeeper = (*s3Store)(nil)

// uploads implements uploadKeeper: ListMultipartUploads under prefix, and
// ListParts of each upload for the parts it stored (a request per upload:
// there are few, and what they hold is the point of listing them).
func (s *s3Store) uploads(ctx context.Context, prefix string) ([]Upload, error) {
	var out []Upload
	in := &s3.ListMultipartUploadsInput{Bucket: aws.String(s.bucket), Prefix: aws.String(s.prefix + prefix)}
	for {
		cctx, cancel := context.WithTimeout(ctx, s3CallTimeout)
		page, err := s.client.ListMultipartUploads(cctx, in)
		cancel()
		if err != nil {
			return nil, s.err("listing the incomplete uploads", prefix, causeErr(ctx, err))
		}
		for _, mu := range page.Uploads {
			u := Upload{Key: strings.TrimPrefix(aws.ToString(mu.Key), s.prefix), ID: aws.ToString(mu.UploadId), Started: aws.ToTime(mu.Initiated)}
			if err := s.partsOf(ctx, &u); err != nil {
				return nil, err
			}
			out = append(out, u)
		}
		if !aws.ToBool(page.IsTruncated) {
			return out, nil
		}
		in.KeyMarker, in.UploadIdMarker = page.NextKeyMarker, page.NextUploadIdMarker
	}
}

// partsOf counts the parts u stored and their bytes. An upload that is gone
// meanwhile (completed or aborted) has none.
func (s *s3Store) partsOf(ctx context.Context, u *Upload) error {
	p := s3.NewListPartsPaginator(s.client, &s3.ListPartsInput{Bucket: aws.String(s.bucket), Key: aws.String(s.prefix + u.Key), UploadId: aws.String(u.ID)})
	for p.HasMorePages() {
		cctx, cancel := context.WithTimeout(ctx, s3CallTimeout)
		page, err := p.NextPage(cctx)
		cancel()
		if noSuchUpload(err) {
			return nil
		}
		if err != nil {
			return s.err("listing the parts of an incomplete upload", u.Key, causeErr(ctx, err))
		}
		for _, part := range page.Parts {
			u.Parts++
			u.Bytes += aws.ToInt64(part.Size)
		}
	}
	return nil
}

// abortUpload implements uploadKeeper.
func (s *s3Store) abortUpload(ctx context.Context, u Upload) error {
	cctx, cancel := context.WithTimeout(ctx, s3CallTimeout)
	defer cancel()
	_, err := s.client.AbortMultipartUpload(cctx, &s3.AbortMultipartUploadInput{Bucket: aws.String(s.bucket), Key: aws.String(s.prefix + u.Key), UploadId: aws.String(u.ID)})
	if err != nil && !noSuchUpload(err) {
		return s.err("aborting an incomplete upload", u.Key, causeErr(ctx, err))
	}
	return nil
}

// noSuchUpload says whether err is S3's NoSuchUpload: the upload was
// completed or aborted already.
func noSuchUpload(err error) bool {
	var ae smithy.APIError
	return errors.As(err, &ae) && ae.ErrorCode() == "NoSuchUpload"
}
