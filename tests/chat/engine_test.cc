#include "gtest/gtest.h"
#include "runtime/chat/template.h"

namespace pagedserve::chat {
namespace {
TEST(Engine, Placeholder) { EXPECT_TRUE(Template::Parse("x").ok()); }
}  // namespace
}  // namespace pagedserve::chat
