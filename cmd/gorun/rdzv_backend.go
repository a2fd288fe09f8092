package main

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"time"

	"github.com/spf13/pflag"

	"github.com/gorun/gorun/membership/etcdlog"
	"github.com/gorun/gorun/p2p"
)

// --rdzv-backend, --rdzv-endpoints and --rdzv-id (torchrun's names): where
// an elastic job's membership is kept. "gorun", the default, is gorun's
// rendezvous (with --rdzv-replicas, a raft group of it and ranks'
// replicas); "etcd" is an etcd cluster, so that neither gorun nor any
// rank is a single point of failure (launcher's Elastic.Etcd).

// minEtcdHeartbeat is the shortest heartbeat bound with the etcd backend:
// the ranks look for a new leader for three bounds, and one is there
// about a second after the old one's lease (etcdlog.MinTTL at least)
// expired.
const minEtcdHeartbeat = 2 * time.Second

// checkRdzvBackend checks the three flags (elastic jobs only: elastic
// says so when the job is not) and reads the endpoints.
func (f *runFlags) checkRdzvBackend(fl *pflag.FlagSet) error {
	switch f.rdzvBackend {
	case "gorun":
		for _, name := range []string{"rdzv-endpoints", "rdzv-id", "rdzv-conf"} {
			if fl.Changed(name) {
				return fmt.Errorf("--%s applies to --rdzv-backend etcd only (the backend is gorun's rendezvous)", name)
			}
		}
		return nil
	case "etcd":
	default:
		return fmt.Errorf("--rdzv-backend %q: want gorun (gorun's rendezvous, the default) or etcd (with --rdzv-endpoints)", f.rdzvBackend)
	}
	if f.heartbeatTimeout < minEtcdHeartbeat {
		return fmt.Errorf("--rdzv-backend etcd needs --heartbeat-timeout %v or more, got %v: a lost leader is replaced once its etcd lease (%v at least) expires, and the ranks look for the new one for 3 heartbeat bounds", minEtcdHeartbeat, f.heartbeatTimeout, etcdlog.MinTTL)
	}
	if f.rdzvEndpoints == "" {
		return fmt.Errorf("--rdzv-backend etcd needs --rdzv-endpoints, the etcd cluster's client addresses (write --rdzv-endpoints h1:2379,h2:2379,h3:2379)")
	}
	var err error
	var https bool
	if f.etcdEndpoints, https, err = etcdlog.ParseEndpoints(f.rdzvEndpoints); err != nil {
		return fmt.Errorf("--rdzv-endpoints %q: %v (write h1:2379,h2:2379,h3:2379)", f.rdzvEndpoints, err)
	}
	if f.etcdTLS, err = readRdzvConf(f.rdzvConf, https); err != nil {
		return err
	}
	if fl.Changed("rdzv-id") {
		if err := etcdlog.CheckJob(f.rdzvID); err != nil {
			return fmt.Errorf("--rdzv-id: %v, new for each run of the job (e.g. --rdzv-id train-42)", err)
		}
	}
	return nil
}

// readRdzvConf reads --rdzv-conf (torchrun's: protocol, cacert, cert,
// key) for an etcd cluster that serves TLS, or https:// endpoints alone
// (the system's roots). The files' paths become absolute: the ranks read
// them where they run, perhaps in another directory.
func readRdzvConf(conf string, https bool) (*etcdlog.TLS, error) {
	t, err := etcdlog.ParseConf(conf)
	if err != nil {
		return nil, fmt.Errorf("--rdzv-conf %q: %v (write cacert=ca.pem,cert=client.pem,key=client-key.pem)", conf, err)
	}
	if t == nil {
		if !https {
			return nil, nil
		}
		t = &etcdlog.TLS{}
	}
	for _, p := range []*string{&t.CACert, &t.Cert, &t.Key} {
		if *p != "" {
			if *p, err = filepath.Abs(*p); err != nil {
				return nil, err
			}
		}
	}
	if _, err := t.Config(); err != nil {
		return nil, fmt.Errorf("--rdzv-conf %q: %v", conf, err)
	}
	return t, nil
}

// etcdGroup is the job's etcd backend (nil: gorun's). Without --rdzv-id,
// a new id for this run: a run must not take up the log of an earlier one.
func (f *runFlags) etcdGroup() (*p2p.EtcdGroup, error) {
	if f.rdzvBackend != "etcd" {
		return nil, nil
	}
	id := f.rdzvID
	if id == "" {
		b := make([]byte, 8)
		if _, err := rand.Read(b); err != nil {
			return nil, err
		}
		id = "gorun-" + hex.EncodeToString(b)
	}
	return &p2p.EtcdGroup{Endpoints: f.etcdEndpoints, RendezvousID: id, TLS: f.etcdTLS}, nil
}
