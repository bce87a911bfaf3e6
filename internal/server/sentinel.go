package server

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// A Sentinel URL, spelled as redis-py's ecosystem spells it (Prefect's
// docket, RedisVL, Redis-Sentinel-Url):
//
//	redis+sentinel://[user:password@]host[:port][,host[:port]...]/master[/db][?options]
//	rediss+sentinel://...   TLS to the sentinels and the data nodes
//
// A sentinel's port defaults to 26379. user:password authenticate to the
// master; the sentinel_username and sentinel_password options to the
// sentinels. The other options are go-redis's URL options (dial_timeout,
// read_timeout, max_retries, ...).
const (
	sentinelScheme    = "redis+sentinel"
	sentinelTLSScheme = "rediss+sentinel"
	sentinelPort      = "26379"
)

// errBadSentinelURL stands for any parse error of a Sentinel URL; what it
// wraps never quotes the URL, which may carry a password.
var errBadSentinelURL = errors.New("not a valid Sentinel URL, want redis+sentinel://[user:password@]host:port[,host:port...]/master[/db]")

// errSentinelCluster refuses --redis-cluster with a Sentinel URL: Sentinel
// watches standalone masters, a cluster fails over by itself.
var errSentinelCluster = errors.New("a Sentinel URL, but the cluster setting (--redis-cluster) wants a cluster URL (redis://host:port?addr=host2:port2)")

// errNoSuchMaster is the sentinels' answer for a master name they do not
// watch.
var errNoSuchMaster = errors.New("the sentinels watch no master of that name (the path of the redis+sentinel:// URL)")

// notSentinelOptions are go-redis options a Sentinel URL spells otherwise
// (in its hosts, path or user info), or that would send the lease store's
// writes to a replica.
var notSentinelOptions = []string{
	"addr", "master_name", "username", "password",
	"replica_only", "route_by_latency", "route_randomly", "route_by_latency_tolerance",
}

// isSentinelURL reports whether raw has a Sentinel scheme.
func isSentinelURL(raw string) bool {
	scheme, _, ok := strings.Cut(raw, "://")
	return ok && (strings.EqualFold(scheme, sentinelScheme) || strings.EqualFold(scheme, sentinelTLSScheme))
}

// sentinelClient returns a client of the master the sentinels at raw
// name, bounded as the constants in store.go say, and the store's identity.
func sentinelClient(raw string) (redis.UniversalClient, string, error) {
	o, err := parseSentinelURL(raw)
	if err != nil {
		return nil, "", err
	}
	bound(&o.ContextTimeoutEnabled, &o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout, &o.MaxRetries, &o.DialerRetries)
	return redis.NewFailoverClient(o), sentinelID(o), nil
}

// parseSentinelURL reads a Sentinel URL into go-redis's options. The
// host list is split by hand: net/url takes "a:1,b:2" for one host, and
// refuses a list with an IPv6 address in it.
func parseSentinelURL(raw string) (*redis.FailoverOptions, error) {
	scheme, rest, _ := strings.Cut(raw, "://")
	authority, tail := rest, ""
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		authority, tail = rest[:i], rest[i:]
	}
	// An '@' past the hosts is a password with an unescaped / ? or # in
	// it; anything read from there on would be a piece of it.
	if strings.Contains(tail, "@") {
		return nil, fmt.Errorf("%w: percent-encode any / ? # in the user info", errBadSentinelURL)
	}
	var userinfo string
	if at := strings.LastIndex(authority, "@"); at >= 0 {
		userinfo, authority = authority[:at], authority[at+1:]
	}
	user, password, err := parseUserinfo(userinfo)
	if err != nil {
		return nil, err
	}
	hosts, err := sentinelHosts(authority)
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(tail)
	if err != nil || u.Fragment != "" {
		return nil, fmt.Errorf("%w: the path or options do not parse", errBadSentinelURL)
	}
	master, db, err := sentinelPath(u.Path)
	if err != nil {
		return nil, err
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("%w: the options do not parse", errBadSentinelURL)
	}
	for _, name := range notSentinelOptions {
		if q.Has(name) {
			return nil, fmt.Errorf("%w: option %s is not allowed here", errBadSentinelURL, name)
		}
	}
	// go-redis's own URL form: the first sentinel as the host, the rest as
	// addr options, the sentinels' credentials as its user info.
	g := url.URL{Scheme: "redis", Host: hosts[0], Path: "/" + db}
	if strings.EqualFold(scheme, sentinelTLSScheme) {
		g.Scheme = "rediss"
	}
	if q.Has("sentinel_username") || q.Has("sentinel_password") {
		g.User = url.UserPassword(q.Get("sentinel_username"), q.Get("sentinel_password"))
		q.Del("sentinel_username")
		q.Del("sentinel_password")
	}
	q.Set("master_name", master)
	for _, h := range hosts[1:] {
		q.Add("addr", h)
	}
	if user != "" {
		q.Set("username", user)
	}
	if password != "" {
		q.Set("password", password)
	}
	g.RawQuery = q.Encode()
	o, err := redis.ParseFailoverURL(g.String())
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			return nil, errBadSentinelURL
		}
		// go-redis names the option at fault, never a credential.
		return nil, fmt.Errorf("%w: %w", errBadSentinelURL, err)
	}
	if o.TLSConfig != nil {
		// go-redis names the first sentinel; each connection must check
		// the certificate of the host it dials.
		o.TLSConfig.ServerName = ""
	}
	return o, nil
}

// parseUserinfo splits and unescapes user:password.
func parseUserinfo(userinfo string) (user, password string, err error) {
	user, password, _ = strings.Cut(userinfo, ":")
	if user, err = url.PathUnescape(user); err != nil {
		return "", "", fmt.Errorf("%w: the user name does not unescape", errBadSentinelURL)
	}
	if password, err = url.PathUnescape(password); err != nil {
		return "", "", fmt.Errorf("%w: the password does not unescape", errBadSentinelURL)
	}
	return user, password, nil
}

// sentinelHosts reads a comma-separated list of host[:port], the port
// 26379 by default, as host:port addresses.
func sentinelHosts(list string) ([]string, error) {
	var addrs []string
	for i, h := range strings.Split(list, ",") {
		host, port, err := net.SplitHostPort(h)
		switch {
		case err == nil:
		case strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]"):
			host, port = h[1:len(h)-1], sentinelPort
		case !strings.Contains(h, ":"):
			host, port = h, sentinelPort
		default:
			return nil, fmt.Errorf("%w: sentinel address %d is not host[:port]", errBadSentinelURL, i+1)
		}
		if n, err := strconv.Atoi(port); host == "" || err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("%w: sentinel address %d is not host[:port]", errBadSentinelURL, i+1)
		}
		addrs = append(addrs, net.JoinHostPort(host, port))
	}
	return addrs, nil
}

// sentinelPath reads /master[/db].
func sentinelPath(path string) (master, db string, err error) {
	parts := strings.Split(strings.TrimPrefix(path, "/"), "/")
	switch {
	case parts[0] == "":
		return "", "", fmt.Errorf("%w: no master name in the path", errBadSentinelURL)
	case len(parts) > 2:
		return "", "", fmt.Errorf("%w: the path is /master[/db], not %d parts", errBadSentinelURL, len(parts))
	case len(parts) == 2 && parts[1] != "":
		if _, err := strconv.ParseUint(parts[1], 10, 31); err != nil {
			return "", "", fmt.Errorf("%w: the database is not a number", errBadSentinelURL)
		}
		return parts[0], parts[1], nil
	}
	return parts[0], "", nil
}

// sentinelID names a Sentinel-watched store by its master's name, its
// database and the sentinels, in any order, without credentials: the
// master's address changes with every failover, the store does not.
func sentinelID(o *redis.FailoverOptions) string {
	addrs := make([]string, len(o.SentinelAddrs))
	for i, a := range o.SentinelAddrs {
		addrs[i] = strings.ToLower(a)
	}
	slices.Sort(addrs)
	return fmt.Sprintf("redis sentinel %s/%d %s", o.MasterName, o.DB, strings.Join(slices.Compact(addrs), ","))
}
