// The reference Thrift service of frametap (docs/design.md, "TTHeader"): a small user and
// order service with structs, lists, maps, a declared exception and a oneway method.
// Used by loadgen/ttheader/server.py, loadgen/ttheader/users.py and the tests.

namespace py frametap_demo

struct User {
  1: i64 id,
  2: string name,
  3: list<string> tags,
  4: map<string, string> attrs,
}

struct Order {
  1: i64 id,
  2: i64 user_id,
  3: list<i64> items,
  4: double total,
}

exception NotFound {
  1: string message,
  2: i64 id,
}

service UserService {
  string echo(1: string message),
  User getUser(1: i64 id) throws (1: NotFound notFound),
  list<User> listUsers(1: i32 limit, 2: map<string, string> filter),
  Order placeOrder(1: i64 userId, 2: list<i64> items) throws (1: NotFound notFound),
  void ping(),
  oneway void log(1: string line),
}

// What an out-of-date client may still call: the server answers `retired` with a
// TApplicationException UNKNOWN_METHOD.
service LegacyUserService extends UserService {
  void retired(),
}
