// Helpers shared by the monitoring tests: a parser for the Prometheus text
// exposition format, a loopback HTTP GET, a free-port finder and a command
// runner. Header-only; test code only.
#ifndef PAGEDSERVE_TESTS_MONITORING_TEST_UTIL_H_
#define PAGEDSERVE_TESTS_MONITORING_TEST_UTIL_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace pagedserve::testing {

// One sample line: name{labels} value.
struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

// Parses the sample lines of a text exposition (comments skipped). Returns
// nullopt on a line it cannot parse, so a malformed output fails the test.
inline std::optional<std::vector<Sample>> ParseExposition(const std::string& text) {
  std::vector<Sample> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    Sample s;
    size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') s.name += line[i++];
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        size_t eq = line.find('=', i);
        if (eq == std::string::npos || eq + 1 >= line.size() || line[eq + 1] != '"')
          return std::nullopt;
        std::string key = line.substr(i, eq - i);
        std::string value;
        size_t j = eq + 2;
        for (; j < line.size() && line[j] != '"'; ++j) {
          if (line[j] == '\\' && j + 1 < line.size()) ++j;
          value += line[j];
        }
        if (j >= line.size()) return std::nullopt;
        s.labels[key] = value;
        i = j + 1;
        if (i < line.size() && line[i] == ',') ++i;
      }
      if (i >= line.size()) return std::nullopt;
      ++i;  // '}'
    }
    if (i >= line.size() || line[i] != ' ') return std::nullopt;
    std::string value = line.substr(i + 1);
    size_t space = value.find(' ');  // optional timestamp
    if (space != std::string::npos) value = value.substr(0, space);
    char* end = nullptr;
    s.value = std::strtod(value.c_str(), &end);
    if (end == value.c_str()) return std::nullopt;
    out.push_back(std::move(s));
  }
  return out;
}

// The samples named `name` whose labels include every pair of `labels`.
inline std::vector<Sample> Find(const std::vector<Sample>& samples, const std::string& name,
                                const std::map<std::string, std::string>& labels = {}) {
  std::vector<Sample> out;
  for (const Sample& s : samples) {
    if (s.name != name) continue;
    bool match = true;
    for (const auto& [k, v] : labels) {
      auto it = s.labels.find(k);
      if (it == s.labels.end() || it->second != v) match = false;
    }
    if (match) out.push_back(s);
  }
  return out;
}

// A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read it,
// close). Another process could take it in between; tests accept that race.
inline int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// HTTP/1.0 GET http://127.0.0.1:port/path. Returns the status code and body,
// or status -1 when the connection fails.
struct HttpResponse {
  int status = -1;
  std::string body;
};
inline HttpResponse HttpGet(int port, const std::string& path) {
  HttpResponse r;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return r;
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return r;
  }
  std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  if (send(fd, req.data(), req.size(), 0) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return r;
  }
  std::string raw;
  char buf[8192];
  for (ssize_t n; (n = recv(fd, buf, sizeof buf, 0)) > 0;) raw.append(buf, n);
  close(fd);
  size_t sp = raw.find(' ');
  size_t hdr_end = raw.find("\r\n\r\n");
  if (sp == std::string::npos || hdr_end == std::string::npos) return r;
  r.status = std::atoi(raw.c_str() + sp + 1);
  r.body = raw.substr(hdr_end + 4);
  return r;
}

// Percent-encodes a query parameter value.
inline std::string UrlEncode(const std::string& s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

// Runs a shell command, returns its exit status and combined stdout+stderr.
struct CommandResult {
  int exit_code = -1;
  std::string output;
};
inline CommandResult RunCommand(const std::string& command) {
  CommandResult r;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) r.output.append(buf, n);
  int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline std::string SourceDir() {
  const char* dir = std::getenv("PAGEDSERVE_SOURCE_DIR");
  return dir ? dir : PAGEDSERVE_SOURCE_DIR_DEFAULT;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace pagedserve::testing

#endif  // PAGEDSERVE_TESTS_MONITORING_TEST_UTIL_H_
