// The cap rule in C++ (src/core/cap.hpp) against the table of cases it shares with the SQL
// statements (test/unit/cap_cases.txt; test/t/180_cap_rule.pl checks the server against it).
#include "core/cap.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

using namespace jobcap::core;

namespace {

struct Case {
    int line;
    CapInputs in;
    std::int32_t attempts;
    Cap cap;
    bool may_claim;
    bool used_up;
};

// A number, or NULL.
bool field(const std::string& word, std::int64_t* value)
{
    if (word == "NULL")
        return false;
    *value = std::stoll(word);
    return true;
}

std::vector<Case> read_cases()
{
    std::ifstream file(JOBCAP_CAP_CASES);
    std::vector<Case> cases;
    std::string text;
    for (int line = 1; std::getline(file, text); ++line) {
        if (text.empty() || text[0] == '#')
            continue;
        std::istringstream words(text);
        std::string w[8];
        for (std::string& word : w)
            words >> word;
        Case c = {};
        c.line = line;
        std::int64_t v = 0;
        c.in.job_max_attempts_null = !field(w[0], &v);
        c.in.job_max_attempts = c.in.job_max_attempts_null ? 0 : static_cast<std::int32_t>(v);
        c.in.job_cap_epoch_null = !field(w[1], &v);
        c.in.job_cap_epoch = c.in.job_cap_epoch_null ? 0 : v;
        field(w[2], &v);
        c.in.queue_max_attempts = static_cast<std::int32_t>(v);
        field(w[3], &v);
        c.in.queue_cap_epoch = v;
        field(w[4], &v);
        c.attempts = static_cast<std::int32_t>(v);
        c.cap.none = !field(w[5], &v);
        c.cap.value = c.cap.none ? 0 : static_cast<std::int32_t>(v);
        c.may_claim = w[6] == "yes";
        c.used_up = w[7] == "yes";
        cases.push_back(c);
    }
    return cases;
}

}  // namespace

TEST(CapRule, TheTableOfCasesIsThere)
{
    EXPECT_GE(read_cases().size(), 20u) << JOBCAP_CAP_CASES;
}

TEST(CapRule, EveryCase)
{
    for (const Case& c : read_cases()) {
        SCOPED_TRACE("cap_cases.txt line " + std::to_string(c.line));
        Cap cap = cap_of(c.in);
        EXPECT_EQ(cap.none, c.cap.none);
        if (!c.cap.none) {
            EXPECT_EQ(cap.value, c.cap.value);
        }
        EXPECT_EQ(may_claim(c.attempts, cap), c.may_claim);
        EXPECT_EQ(attempts_used_up(c.attempts, cap), c.used_up);
    }
}
