package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
)

// objectLocation is where the demo's G4 objects go: the directory dir, or,
// with KVBM_DEMO_S3=1, a fresh prefix of the bucket of the local S3 server
// `make demo KVBM_DEMO_S3=1` starts (scripts/with-s3.sh exports its
// endpoint, credentials and bucket).
func objectLocation(dir string) (string, error) {
	if os.Getenv("KVBM_DEMO_S3") != "1" {
		return dir, nil
	}
	bucket := os.Getenv("KVBM_S3_BUCKET")
	if bucket == "" || os.Getenv("AWS_ENDPOINT_URL_S3") == "" {
		return "", errors.New("KVBM_DEMO_S3=1 needs the server `make demo KVBM_DEMO_S3=1` starts (KVBM_S3_BUCKET and AWS_ENDPOINT_URL_S3 are not set)")
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "s3://" + bucket + "/kvbm-demo/" + hex.EncodeToString(b[:]), nil
}
