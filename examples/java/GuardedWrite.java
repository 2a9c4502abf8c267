// A leader's write into a table protected by the fencing guard, from Java (JDBC, pgjdbc).
//
// Usage: java -cp /usr/share/java/postgresql.jar examples/java/GuardedWrite.java \
//            'jdbc:postgresql://127.0.0.1:5432/app?user=app'
// The same three points as the Python example: set_config('fencing.token', ?, true) inside the
// write's transaction (a bind parameter cannot be used with SET LOCAL), autocommit off for it
// (with autocommit on, set_config and the write are two transactions and the token is gone), and
// SQLSTATE ZF409 caught as "stop acting as leader". Exits 0 when every step behaved so.

import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;

public class GuardedWrite {
    static final String STALE = "ZF409";

    static long acquire(Connection conn, String owner, String ttl) throws SQLException {
        try (PreparedStatement st = conn.prepareStatement(
                "SELECT term FROM fencing.acquire('java-writer', ?, ?::interval)")) {
            st.setString(1, owner);
            st.setString(2, ttl);
            try (ResultSet rs = st.executeQuery()) {
                rs.next();
                return rs.getLong(1);
            }
        }
    }

    /** The pattern: one transaction, the token set inside it with set_config(..., true). */
    static void write(Connection conn, long term, int id) throws SQLException {
        conn.setAutoCommit(false);
        try (PreparedStatement token = conn.prepareStatement("SELECT set_config('fencing.token', ?, true)");
             PreparedStatement insert = conn.prepareStatement("INSERT INTO java_orders (id, status) VALUES (?, 'new')")) {
            token.setString(1, Long.toString(term));
            token.execute();
            insert.setInt(1, id);
            insert.executeUpdate();
            conn.commit();
        } catch (SQLException e) {
            conn.rollback();
            throw e;
        } finally {
            conn.setAutoCommit(true);
        }
    }

    public static void main(String[] args) throws Exception {
        try (Connection conn = DriverManager.getConnection(args[0])) {
            try (Statement st = conn.createStatement()) {
                st.execute("DROP TABLE IF EXISTS java_orders");
                st.execute("CREATE TABLE java_orders (id int PRIMARY KEY, status text NOT NULL)");
                st.execute("SELECT fencing.protect('java_orders', 'java_orders', NULL)");
                st.execute("SELECT fencing.bind('java_orders', 'java-writer')");
            }
            long old = acquire(conn, "old", "1 millisecond");
            Thread.sleep(20);
            long current = acquire(conn, "new", "60 seconds");
            System.out.println("terms: old leader " + old + ", current leader " + current);

            write(conn, current, 1);
            System.out.println("current leader's write with term " + current + ": committed");

            // The autocommit pitfall.
            try (PreparedStatement token = conn.prepareStatement("SELECT set_config('fencing.token', ?, true)");
                 Statement insert = conn.createStatement()) {
                token.setString(1, Long.toString(current));
                token.execute();
                insert.executeUpdate("INSERT INTO java_orders (id, status) VALUES (2, 'new')");
                System.out.println("autocommit pitfall: the write went through without a token (unexpected)");
                System.exit(1);
            } catch (SQLException e) {
                if (!STALE.equals(e.getSQLState())) throw e;
                System.out.println("autocommit pitfall: the token was gone before the INSERT; refused with ZF409");
            }

            try {
                write(conn, old, 3);
                System.out.println("old leader's write: committed (unexpected)");
                System.exit(1);
            } catch (SQLException e) {
                if (!STALE.equals(e.getSQLState())) throw e;
                System.out.println("old leader's write with term " + old + ": refused with ZF409: stop acting as leader");
            }

            try (Statement st = conn.createStatement(); ResultSet rs = st.executeQuery("SELECT count(*) FROM java_orders")) {
                rs.next();
                long rows = rs.getLong(1);
                System.out.println("rows in java_orders: " + rows);
                System.exit(rows == 1 ? 0 : 1);
            }
        }
    }
}
